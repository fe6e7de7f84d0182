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
Each variant runs in its own process (the extension is built once, the variant read at the first call),
checks its output against fp32 cuBLAS with a bf16-rounding bound, then times both with the bench's
method (CUDA graph replays, L2 flushed, median), so each ratio comes from one process.
"""
from __future__ import annotations

import os

import torch

import rosetta
from rosetta import timing

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (5120, 1536, 3072), (3000, 3000, 3000)]  # (M, K, N)


def main() -> None:
    variant = os.environ.get("ABL", "base")
    flush = timing.Flush()
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for m, k, n in SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            step13 = lambda: rosetta.matmul(a, b, backend="cuda", step=13)  # noqa: E731
            out, ref = step13().float(), a.float() @ b.float()
            bound = (a.float().abs() @ b.float().abs()) * 2.0 ** -7  # a few bf16 roundings of |a| |b|
            bad = int(((out - ref).abs() > bound).sum()) + int(out.isnan().sum())
            flop = 2 * m * n * k
            t_cublas = timing.measure(lambda: a @ b, flush)["p50_ms"]
            t_step = timing.measure(step13, flush)["p50_ms"]
            print(f"{variant:13s} {str(dtype)[6:]:8s} {m}x{k}x{n} cublas {flop / t_cublas / 1e9:6.1f} "
                  f"step13 {flop / t_step / 1e9:6.1f} TFLOP/s x{t_cublas / t_step:.3f} bad {bad}", flush=True)


if __name__ == "__main__":
    main()
