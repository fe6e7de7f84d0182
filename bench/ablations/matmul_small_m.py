"""Matmul at M <= 8 (decode-sized products): the GEMV steps against cuBLAS and the split-K steps,
and Triton step 8 with its constants varied.

Subjects per shape: torch.mm (cuBLAS), CUDA steps 14 (split-K on wgmma) and 15 (GEMV), Triton
steps 7 (split-K on tl.dot) and 8 (GEMV), and step 8 run with other values of its module
constants, named k{BLOCK_K}s{MAX_SPLIT}m{MIN_SLICE}w{NUM_WARPS}p{PROGRAMS_PER_SM}:
  BLOCK_K          rows of B a program loads (unrolled) before it multiplies
  MAX_SPLIT        most K-slices; MIN_SLICE the fewest rows a slice may have
  NUM_WARPS        warps a program; PROGRAMS_PER_SM the grid's target
Each constant set is applied to the step's module for that subject's launches only (set, launch,
restore), so the step's code is what runs. Every subject is checked against fp64 first, then all
are timed in turns with the bench's method (CUDA-graph replays, L2 flushed, median;
rosetta.timing.measure_in_turns). On a GPU box, from the repository root:
python bench/ablations/matmul_small_m.py
"""
import torch

from rosetta import registry, torch_ops
from rosetta.bench import environment
from rosetta.timing import Flush, measure_in_turns

SHAPES = ((1, 4096, 4096), (4, 4096, 4096), (8, 4096, 4096), (1, 768, 3072), (8, 768, 3072),
          (1, 4096, 14336), (8, 4096, 14336), (1, 14336, 4096))
STEP8_VARIANTS = ((8, 64, 64, 4, 4), (16, 64, 64, 4, 4), (8, 128, 32, 4, 4), (16, 128, 32, 4, 4),
                  (16, 128, 32, 8, 2), (32, 128, 32, 4, 4))
CONSTANTS = ("BLOCK_K", "MAX_SPLIT", "MIN_SLICE", "NUM_WARPS", "PROGRAMS_PER_SM")


def step_launch(backend, step, a, b, out, constants=None):
    """The step's launch into `out`, with Triton step 8's module constants set around it."""
    v = registry.select("matmul", backend, step, a.dtype, (a, b))
    launch = v.launcher("forward", (a, b), out)[0]
    if constants is None:
        return launch
    module = torch_ops.triton_module(v)

    def with_constants():
        kept = {name: getattr(module, name) for name in CONSTANTS}
        for name, value in zip(CONSTANTS, constants):
            setattr(module, name, value)
        try:
            launch()
        finally:
            for name, value in kept.items():
                setattr(module, name, value)
    return with_constants


def time_case(M, K, N, dtype, subjects, flush) -> str:
    """One product, fresh inputs: each subject, (name, make) with make(a, b, out) -> a launch into
    out, checked against fp64 first (a wrong one is reported and left out), then all timed in
    turns. Returns the line "name us  name us ...". Also used by matmul_triton_gemv.py."""
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    names, launches = [], []
    for name, make in subjects:
        out = torch.empty(M, N, device="cuda", dtype=dtype)
        launch = make(a, b, out)
        launch()
        torch.cuda.synchronize()
        err = ((out.double() - ref).abs() / scale.clamp_min(1e-30)).max().item()
        if not err < 2e-2:  # NaN fails too
            print(f"  WRONG {name}: {err:.3g}")
            continue
        names.append(name)
        launches.append([launch])
    times = [r["p50_ms"] * 1e3 for r in measure_in_turns(launches, flush)]
    return "  ".join(f"{n} {t:.1f}" for n, t in zip(names, times))


def cublas(a, b, out):
    return lambda: torch.mm(a, b, out=out)


def main():
    flush = Flush("read")
    for dtype in (torch.bfloat16, torch.float32):
        for M, K, N in SHAPES:
            subjects = [("cublas", cublas)]
            for backend, step in (("cuda", 14), ("cuda", 15), ("triton", 7), ("triton", 8)):
                if dtype == torch.float32 and (backend, step) == ("cuda", 14):
                    continue  # a wgmma step: 16-bit only
                subjects.append((f"{backend}{step}",
                                 lambda a, b, out, backend=backend, step=step: step_launch(backend, step, a, b, out)))
            for constants in STEP8_VARIANTS:
                subjects.append(("k{}s{}m{}w{}p{}".format(*constants),
                                 lambda a, b, out, c=constants: step_launch("triton", 8, a, b, out, c)))
            row = time_case(M, K, N, dtype, subjects, flush)
            print(f"{str(dtype).removeprefix('torch.')} {M}x{K}x{N}: {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# matmul at M <= 8: GEMV steps, split-K steps, cuBLAS (bench/ablations/matmul_small_m.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns)")
    main()
