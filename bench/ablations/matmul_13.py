"""Step 13's ablations: each switches one of its choices back and times it beside cuBLAS.

matmul_13.patch (beside this file) adds the switches to cuda-kernels/matmul/13_persistent_clusters.cu,
read once per process from the ABL environment variable (row-major a and b only):

  base           the step as committed
  nomc           no multicast: each CTA of a pair loads its own B tile
  amc            the pair's tiles side by side, sharing A by multicast (cuBLAS's 1 x 2 clusters) instead of B
  hilbert        tiles walked in Hilbert order (a host-made table) instead of grouped order
  scaled         the first k-slice's wgmma runs with scale-d = 0 instead of zeroed accumulators
  nonpersistent  one cluster per tile pair instead of a persistent grid the size of the chip

On a GPU box, from the repository root:
  git apply bench/ablations/matmul_13.patch
  for v in base nomc amc hilbert scaled nonpersistent; do ABL=$v python bench/ablations/matmul_13.py; done
  git apply -R bench/ablations/matmul_13.patch
Each variant runs in its own process (the extension is built once, the variant read at the first call).
It is checked as the bench checks a step (the matmul spec's fp64 reference, error and tolerance), then
timed beside the cuBLAS tier with the bench's method: CUDA graph replays, L2 flushed, median, the two
in turns, each on PLACEMENTS outputs of its own in rotation (timing.measure_in_turns says why), so each
ratio compares the same moments of the GPU in one process.
"""
from __future__ import annotations

import os

import torch

import rosetta
from rosetta import timing
from rosetta.bench.run.suite import PLACEMENTS
from rosetta.ops import SPECS

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (5120, 1536, 3072), (3000, 3000, 3000)]  # M x K x N


def main() -> None:
    variant = os.environ.get("ABL", "base")
    forward = SPECS["matmul"].forward
    flush = timing.Flush()
    gen = torch.Generator(device="cuda").manual_seed(0)
    step = next(v for v in rosetta.variants(op="matmul", backend="cuda") if v.step == 13)
    for dtype in (torch.bfloat16, torch.float16):
        for shape in SHAPES:
            a, b = forward.make_inputs(shape, dtype, "cuda", gen)
            outs = [forward.allocate(a, b).fill_(float("nan")) for _ in range(2 * PLACEMENTS)]
            step13 = [step.launcher("forward", (a, b), out)[0] for out in outs[:PLACEMENTS]]
            cublas = [lambda out=out: forward.torch_eager(a, b, out) for out in outs[PLACEMENTS:]]  # the bench's tier
            step13[0]()
            err = forward.error(outs[0], forward.reference(a, b), (a, b)) / forward.tolerance[dtype]
            t_cublas, t_step = (t["p50_ms"] for t in timing.measure_in_turns([cublas, step13], flush))
            flop = forward.flops(shape)
            print(f"{variant:13s} {str(dtype)[6:]:8s} {'x'.join(map(str, shape))} cublas {flop / t_cublas / 1e9:6.1f} "
                  f"step13 {flop / t_step / 1e9:6.1f} TFLOP/s x{t_cublas / t_step:.3f} error/tol {err:.2f}", flush=True)


if __name__ == "__main__":
    main()
