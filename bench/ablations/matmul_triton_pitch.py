"""Triton matmul step 5 (persistent, TMA) at bf16 3000^3, where it runs at ~0.57x cuBLAS: is the
row pitch the cause? Its header's claim: rows of 6,000 bytes make most 128-byte TMA box rows
straddle two L2 lines. Here the same 3000^3 product runs on A and B whose rows lie 3,008 elements
(6,016 bytes: 47 x 128) apart, views of wider buffers: the same math, every box row on whole lines.
4096^3 and 3072^3 are the references with aligned rows.

Subjects per shape: torch.mm (cuBLAS), step 5 on contiguous operands, step 5 on the padded views
(same product), CUDA-graph replays in turns with the L2 flushed (rosetta.timing.measure_in_turns).
On a GPU box, from the repository root: python bench/ablations/matmul_triton_pitch.py
"""
import torch

from rosetta import registry
from rosetta.bench import environment
from rosetta.timing import Flush, measure_in_turns

CASES = ((3000, 3000, 3000, 3008), (3072, 3072, 3072, 3072 + 64), (4096, 4096, 4096, 4096 + 64), (3000, 4096, 4096, 4096 + 64),
         (4096, 3000, 4096, 3008), (4096, 4096, 3000, 3008))


def step5(a, b, out):
    v = registry.select("matmul", "triton", 5, a.dtype, (a, b))
    return v.launcher("forward", (a, b), out)[0]


def main():
    flush = Flush("read")
    for M, K, N, pitch in CASES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        a_wide = torch.zeros(M, max(pitch, K), device="cuda", dtype=torch.bfloat16)[:, :K]
        b_wide = torch.zeros(K, max(pitch, N), device="cuda", dtype=torch.bfloat16)[:, :N]
        a_wide.copy_(a)
        b_wide.copy_(b)
        ref = a.float() @ b.float()
        names, subjects = [], []
        for name, x, y in (("cublas", a, b), ("step5", a, b), ("step5 padded", a_wide, b_wide)):
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            launch = (lambda x=x, y=y, out=out: torch.mm(x, y, out=out)) if name == "cublas" else step5(x, y, out)
            launch()
            torch.cuda.synchronize()
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 2e-2:
                print(f"  WRONG {name}: {err:.3g}", flush=True)
                continue
            names.append(name)
            subjects.append([launch])
        times = [r["p50_ms"] * 1e3 for r in measure_in_turns(subjects, flush)]
        tflops = [2 * M * N * K / (t * 1e-6) / 1e12 for t in times]
        row = "  ".join(f"{n} {t:.1f} us {f:.0f}" for n, t, f in zip(names, times, tflops))
        print(f"bf16 {M}x{K}x{N} (padded pitch {pitch}): {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# Triton matmul step 5 and the row pitch (bench/ablations/matmul_triton_pitch.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns) and TFLOP/s")
    main()
