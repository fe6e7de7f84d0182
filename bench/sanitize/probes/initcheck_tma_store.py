"""Initcheck probe: does a read of memory that a TMA store wrote count as uninitialized?

matmul13_then_add: matmul CUDA step 13 stores C by TMA, then torch's `c + 1` reads it.
gelu1_n60: linear_gelu CUDA step 1 at N = 60 (rows not whole 16 bytes: no TMA store).
On the H100 the first draws 8,192 initcheck reports (one per 16 bytes of C), the second none:
initcheck does not see the copy engine's writes. Run on a GPU box:
    compute-sanitizer --tool initcheck python bench/sanitize/probes/initcheck_tma_store.py matmul13_then_add
Explains: initcheck linear_gelu/cuda/*
"""
import sys

import torch

import rosetta


def main(case: str) -> None:
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    if case == "matmul13_then_add":
        a = torch.randn(256, 256, device="cuda", dtype=bf16)
        b = torch.randn(256, 256, device="cuda", dtype=bf16)
        c = rosetta.matmul(a, b, backend="cuda", step=13)
        c + 1  # a read of every element the TMA store wrote
    elif case == "gelu1_n60":
        a = torch.randn(64, 64, device="cuda", dtype=bf16)
        w = torch.randn(64, 60, device="cuda", dtype=bf16)
        bias = torch.randn(60, device="cuda", dtype=bf16)
        rosetta.linear_gelu(a, w, bias, backend="cuda", step=1)
    else:
        raise SystemExit(f"unknown case {case!r}: matmul13_then_add or gelu1_n60")
    torch.cuda.synchronize()
    print("probe done", case, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
