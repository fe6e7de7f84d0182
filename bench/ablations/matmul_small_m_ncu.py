"""Where small-M and small products lose to cuBLAS: each subject's kernels under Nsight Compute.

The shape suite's worst matmul cases are small: bf16 1 to 128 x 4,096 x 4,096 (CUDA step 14 at
0.80-0.88x cuBLAS) and the GPT-2 family 1 to 256 x 768 x 3,072 (0.69-0.84x), ~2-4 us behind in
products of 7-22 us. Graph timing gives one number a call; this lists every kernel a call
launches, with its own duration, grid, shared memory and DRAM traffic, for cuBLAS (torch.mm),
CUDA steps 11, 14 and 18 and Triton steps 4 and 7. Each subject runs once to compile and tune,
then once inside the NVTX ranges probe/<shape>_<subject> (domain rosetta), which is all ncu
profiles (--nvtx-include, --clock-control none: clocks untouched, --cache-control all: caches
flushed before each kernel, as the bench's flush). The kernels come out in the order launched:
shapes in SHAPES' order, subjects in SUBJECTS' after cuBLAS, told apart by their names.

On a GPU box, from the repository root:
ncu --clock-control none --cache-control all --nvtx --nvtx-include "rosetta@probe/" --csv \\
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,\\
launch__block_size,launch__shared_mem_per_block_dynamic,launch__cluster_dim_x,sm__throughput.avg.pct_of_peak_sustained_elapsed \\
    python bench/ablations/matmul_small_m_ncu.py > ncu.csv
"""
import torch

from rosetta import registry
from rosetta.bench.run import nvtx

SHAPES = ((1, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096), (1, 768, 3072), (128, 768, 3072))
SUBJECTS = (("cuda", 11), ("cuda", 14), ("cuda", 18), ("triton", 4), ("triton", 7))


def main():
    for M, K, N in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        subjects = [("cublas", None)] + [(f"{backend}{step}", registry.select("matmul", backend, step, a.dtype, (a, b)))
                                         for backend, step in SUBJECTS]
        for name, v in subjects:
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            # the launcher (tensor maps, workspace) made here, outside the profiled range
            launch = (lambda out=out: torch.mm(a, b, out=out)) if v is None else v.launcher("forward", (a, b), out)[0]
            launch()  # compile, tune
            torch.cuda.synchronize()
            with nvtx.step_range(f"probe/{M}x{K}x{N}_{name}"):
                launch()
                torch.cuda.synchronize()


if __name__ == "__main__":
    main()
