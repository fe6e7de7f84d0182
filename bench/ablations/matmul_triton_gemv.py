"""One row of A (decode-sized products): Triton's one-row GEMV (step 11) against the split-K steps
(7, 9), the rank-1 GEMV (step 8) and cuBLAS, including an odd row the shape suite lacks.

Subjects per shape: torch.mm (cuBLAS), Triton steps 7, 8, 9 and 11, each through its own launch
into a preallocated output. Every subject is checked against fp64 first, then all are timed in
turns with the bench's method (CUDA-graph replays, L2 flushed, median;
rosetta.timing.measure_in_turns). On a GPU box, from the repository root:
python bench/ablations/matmul_triton_gemv.py
"""
import torch

from rosetta import registry
from rosetta.bench import environment
from rosetta.timing import Flush, measure_in_turns

CASES = ([((1, k, n), torch.bfloat16) for k, n in ((768, 3072), (4096, 4096), (4096, 14336), (14336, 4096),
                                                    (3584, 18944), (8192, 28672), (997, 1013))]
         + [((1, 4096, 4096), torch.float16), ((1, 4096, 14336), torch.float16),
            ((1, 4096, 4096), torch.float32), ((1, 768, 3072), torch.float32)])
STEPS = (7, 8, 9, 11)


def main():
    flush = Flush("read")
    for (M, K, N), dtype in CASES:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        ref = a.double() @ b.double()
        scale = a.double().abs() @ b.double().abs()
        names, subjects = [], []

        def add(name, launch, out):
            launch()
            torch.cuda.synchronize()
            err = ((out.double() - ref).abs() / scale.clamp_min(1e-30)).max().item()
            if not err < 2e-2:  # NaN fails too
                print(f"  WRONG {name}: {err:.3g}")
                return
            names.append(name)
            subjects.append([launch])

        out = torch.empty(M, N, device="cuda", dtype=dtype)
        add("cublas", lambda out=out: torch.mm(a, b, out=out), out)
        for step in STEPS:
            out = torch.empty(M, N, device="cuda", dtype=dtype)
            v = registry.select("matmul", "triton", step, dtype, (a, b))
            add(f"t{step}", v.launcher("forward", (a, b), out)[0], out)
        times = [r["p50_ms"] * 1e3 for r in measure_in_turns(subjects, flush)]
        row = "  ".join(f"{n} {t:.1f}" for n, t in zip(names, times))
        print(f"{str(dtype).removeprefix('torch.')} {M}x{K}x{N}: {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# one row of A: Triton's GEMV steps, split-K steps, cuBLAS (bench/ablations/matmul_triton_gemv.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns); tN: Triton step N")
    main()
