"""One row of A (decode-sized products): Triton's one-row GEMV (step 11) against the split-K steps
(7, 9), the rank-1 GEMV (step 8) and cuBLAS, including an odd row the shape suite lacks.

Subjects per shape: torch.mm (cuBLAS), Triton steps 7, 8, 9 and 11, each through its own launch
into a preallocated output. Every subject is checked against fp64 first, then all are timed in
turns with the bench's method (CUDA-graph replays, L2 flushed, median;
rosetta.timing.measure_in_turns). On a GPU box, from the repository root:
python bench/ablations/matmul_triton_gemv.py
"""
import torch

from rosetta.bench import environment
from rosetta.timing import Flush

from matmul_small_m import cublas, step_launch, time_case  # the same check-then-time of one product

CASES = ([((1, k, n), torch.bfloat16) for k, n in ((768, 3072), (4096, 4096), (4096, 14336), (14336, 4096),
                                                    (3584, 18944), (8192, 28672), (997, 1013))]
         + [((1, 4096, 4096), torch.float16), ((1, 4096, 14336), torch.float16),
            ((1, 4096, 4096), torch.float32), ((1, 768, 3072), torch.float32)])
STEPS = (7, 8, 9, 11)


def main():
    flush = Flush("read")
    subjects = [("cublas", cublas)] + [(f"t{step}", lambda a, b, out, step=step: step_launch("triton", step, a, b, out))
                                       for step in STEPS]
    for (M, K, N), dtype in CASES:
        row = time_case(M, K, N, dtype, subjects, flush)
        print(f"{str(dtype).removeprefix('torch.')} {M}x{K}x{N}: {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# one row of A: Triton's GEMV steps, split-K steps, cuBLAS (bench/ablations/matmul_triton_gemv.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns); tN: Triton step N")
    main()
