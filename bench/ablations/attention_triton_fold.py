"""Triton attention step 2's forward tiles with the softmax scale folded into exp2's FFMA (FOLD=1:
max on raw scores, P = exp2(k s - m)) and without (FOLD=0: S * k first), each with 64-bit and with
32-bit row offsets inside a head (ROWS32), every tile of its FORWARD_CONFIGS, bf16, non-causal,
timed in turns with the bench's method (CUDA graph replays, L2 flushed, median;
timing.measure_in_turns). No patch: FOLD and ROWS32 are constexprs of the kernel, launched here
directly with each tile. On a GPU box, from the repository root:
  python bench/ablations/attention_triton_fold.py
"""
from __future__ import annotations

import torch

from rosetta import registry, timing
from rosetta.ops import SPECS
from rosetta.ops.attention import SCALE
from rosetta.torch_ops import triton_module
from rosetta.triton_kernels.common import cdiv

SHAPES = ((4, 16, 4096, 4096, 128), (1, 16, 16384, 16384, 128), (4, 32, 4096, 4096, 64))
LOG2E = 1.4426950408889634


def main() -> None:
    forward = SPECS["attention"].forward
    flush = timing.Flush()
    gen = torch.Generator(device="cuda").manual_seed(0)
    step2 = triton_module(registry.select("attention", "triton", 2))
    for shape in SHAPES:
        B, H, S, _, D = shape
        q, k, v = forward.make_inputs(shape, torch.bfloat16, "cuda", gen)
        ref = forward.reference(q, k, v, 0, SCALE)
        names, subjects = [], []
        for bm, bn, warps, stages, _fold in step2.FORWARD_CONFIGS[D]:
            for fold, rows32 in ((False, False), (False, True), (True, False), (True, True)):
                out, lse = forward.allocate(q, k, v)

                def run(bm=bm, bn=bn, warps=warps, stages=stages, fold=fold, rows32=rows32, out=out, lse=lse):
                    step2.attention_causal_kernel[(B * H * cdiv(S, bm),)](
                        q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], H, S, S,
                        SCALE * LOG2E, CAUSAL=False, POSITIVE_SCALE=True, FOLD=fold, ROWS32=rows32, HEAD_DIM=D, BLOCK_M=bm,
                        BLOCK_N=bn, num_warps=warps, num_stages=stages)
                run()
                worst = max(err for _, (err, *_r) in forward.output_errors((out, lse), ref, (q, k, v)))
                assert worst <= forward.tolerance[torch.bfloat16], (shape, bm, bn, fold, rows32, worst)
                names.append(f"{bm}x{bn} {warps}w {stages}s fold={int(fold)} rows32={int(rows32)}")
                subjects.append([run])
        times = [t["p50_ms"] for t in timing.measure_in_turns(subjects, flush)]
        flop = forward.flops(shape)
        print(f"{'x'.join(map(str, shape))}: " + ", ".join(f"{n} {flop / t / 1e9:.0f}" for n, t in zip(names, times))
              + " TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
