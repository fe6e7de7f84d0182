"""Triton matmul step 5 (persistent, TMA) at bf16 3000^3, where it runs at ~0.57x cuBLAS: is the
row pitch the cause, which operand's, and does a tile that reads fewer bytes of that operand a
flop help? Rows of 6,000 bytes make most 128-byte TMA box rows straddle two L2 lines. Here the same
products run on operands whose rows lie whole multiples of 128 bytes apart (views of wider
buffers: the same math, every box row on whole lines), one operand at a time.

Subjects per shape (M x K x N): torch.mm (cuBLAS); step 5 on contiguous operands (its tuner);
step 5 with A's rows padded, with B's, with both ("padded"); step 5 on B stored column-major
(B^T contiguous: its pitch becomes K's); step 5's kernel held to one tile each, 128 x 256 (its
headline tile), 256 x 128 at 3 stages, 256 x 128 at 4 stages with the half-width epilogue (B read
over 256 rows, not 128: half B's bytes a flop, twice A's). CUDA-graph replays in turns with the L2
flushed (rosetta.timing.measure_in_turns); a subject whose output is off by >= 2e-2 of the largest
is dropped. On a GPU box, from the repository root: python bench/ablations/matmul_triton_pitch.py
"""
import torch
import triton

import rosetta
from rosetta.bench import environment
from rosetta.timing import Flush, measure_in_turns
from rosetta.torch_ops import triton_module

CASES = ((3000, 3000, 3000), (4096, 4096, 3000), (4096, 3000, 4096), (3000, 4096, 4096), (2048, 4096, 3000),
         (3072, 3072, 3072), (4096, 4096, 4096))
STEP5 = triton_module(next(v for v in rosetta.variants(op="matmul", backend="triton") if v.step == 5))
TUNED = STEP5.matmul_persistent_tma_kernel
KEY = ["M", "N", "K", "A_COLS", "B_COLS"]


def one_tile(bm, bn, warps, stages, subtile):
    """Step 5's kernel under a tuner of one config."""
    config = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "EPILOGUE_SUBTILE": subtile},
                           num_warps=warps, num_stages=stages)
    return triton.autotune(configs=[config], key=KEY)(TUNED.fn)


TILES = {"128x256": one_tile(128, 256, 8, 3, False), "256x128 s3": one_tile(256, 128, 8, 3, False),
         "256x128 s4 half-epilogue": one_tile(256, 128, 8, 4, True)}


def step5(a, b, out, kernel=TUNED):
    def launch():
        STEP5.matmul_persistent_tma_kernel = kernel  # launch() looks the kernel up by name
        try:
            STEP5.launch(a, b, out)
        finally:
            STEP5.matmul_persistent_tma_kernel = TUNED
    return launch


def padded(t):
    """t's values in a view whose rows lie a multiple of 128 bytes apart (and one line more)."""
    rows, cols = t.shape
    wide = torch.zeros(rows, (cols + 63) // 64 * 64 + 64, device=t.device, dtype=t.dtype)[:, :cols]
    wide.copy_(t)
    return wide


def main():
    flush = Flush("read")
    for M, K, N in CASES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        subjects_at = [("cublas", a, b, None), ("step5", a, b, TUNED), ("A padded", padded(a), b, TUNED),
                       ("B padded", a, padded(b), TUNED), ("padded", padded(a), padded(b), TUNED),
                       ("B col-major", a, b.t().contiguous().t(), TUNED)]
        subjects_at += [(name, a, b, kernel) for name, kernel in TILES.items()]
        names, subjects = [], []
        for name, x, y, kernel in subjects_at:
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            launch = (lambda x=x, y=y, out=out: torch.mm(x, y, out=out)) if kernel is None else step5(x, y, out, kernel)
            launch()
            torch.cuda.synchronize()
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 2e-2:
                print(f"  WRONG {name}: {err:.3g}", flush=True)
                continue
            names.append(name)
            subjects.append([launch])
        times = [r["p50_ms"] * 1e3 for r in measure_in_turns(subjects, flush)]
        row = "  ".join(f"{n} {t:.1f}" for n, t in zip(names, times))
        print(f"bf16 {M}x{K}x{N}: {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# Triton matmul step 5 and the row pitch (bench/ablations/matmul_triton_pitch.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns), shapes M x K x N")
    main()
