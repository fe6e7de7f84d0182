"""Measured ceilings. Kernels come from kernels.cu via CuPy's RawModule (NVRTC); buffers are torch
tensors handed to CuPy through DLPack, so both libraries work on the same memory. Timing is
triton.testing.do_bench (median of repeated runs, L2 flushed before each)."""
from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

KERNELS = Path(__file__).with_name("kernels.cu")
THREADS = 256


def _module():
    import cupy

    return cupy.RawModule(code=KERNELS.read_text(), options=("-std=c++17",),
                          name_expressions=None)


def _bench(fn, reps=5):
    """Median and p20/p80 of do_bench medians taken `reps` times (ms)."""
    from triton.testing import do_bench

    times = sorted(do_bench(fn, warmup=25, rep=200, return_mode="median") for _ in range(reps))
    return {"median_ms": statistics.median(times), "min_ms": times[0], "max_ms": times[-1]}


def _cupy(t):
    import cupy

    return cupy.from_dlpack(t)  # zero-copy: the same device memory torch allocated


def dram_copy(nbytes: int = 2**30) -> dict:
    """Own copy kernel vs torch's copy_, same buffers, same run. Bytes = read + write."""
    mod = _module()
    n4 = nbytes // 16
    assert n4 % (THREADS * 4) == 0, "copy_f4 moves whole 16 KB tiles"
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    kernel = mod.get_function("copy_f4")
    s, d = _cupy(src), _cupy(dst)
    # CuPy passes Python ints as 64-bit and floats as double: give each argument its C type
    own = _bench(lambda: kernel((n4 // (THREADS * 4),), (THREADS,), (s, d, np.int64(n4))))
    assert torch.equal(dst, src), "copy_f4 copied wrongly"
    lib = _bench(lambda: dst.copy_(src))
    return {"own": _rate(own, 2 * nbytes), "torch": _rate(lib, 2 * nbytes)}


def read_bandwidth(nbytes: int, passes: int, label: str) -> dict:
    """Read-only streaming over `nbytes`, `passes` times. Large nbytes: DRAM; a working set well
    inside L2 read many times: L2 (the first pass, after the flush, comes from DRAM)."""
    mod = _module()
    x = torch.rand(nbytes // 4, device="cuda")
    sink = torch.zeros(1, device="cuda")
    kernel = mod.get_function("read_f4")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    xs, ss, n4 = _cupy(x), _cupy(sink), nbytes // 16
    args = (xs, np.int64(n4), np.int32(passes), ss)
    timing = _bench(lambda: kernel((sms * 8,), (THREADS,), args))
    return {label: _rate(timing, nbytes * passes)}


def fp32_fma() -> dict:
    """FFMA rate with the SM clock sampled (NVML) while the kernel runs."""
    mod = _module()
    kernel = mod.get_function("fma_chains")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, iters = sms * 8, 4096
    out = torch.empty(blocks * THREADS, device="cuda")
    o = _cupy(out)
    args = (o, np.int32(iters), np.float32(0.9999), np.float32(1e-4))
    run = lambda: kernel((blocks,), (THREADS,), args)  # noqa: E731
    flops = blocks * THREADS * iters * 16 * 8 * 2
    run()
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(torch.cuda.clock_rate(0))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        timing = _bench(run)
    finally:
        stop.set()
        sampler.join()
    assert torch.isfinite(out).all()
    tflops = flops / (timing["median_ms"] * 1e-3) / 1e12
    return {"tflops": tflops, **timing, "sm_clock_mhz_during": statistics.median(clocks),
            "flops_per_run": flops}


def tensor_rates(n: int = 8192) -> dict:
    """The vendor library's (cuBLAS via torch.matmul) rate on large square GEMMs."""
    rates = {}
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, False),
                              ("tf32", torch.float32, True)):
        a = torch.randn(n, n, device="cuda").to(dtype)
        b = torch.randn(n, n, device="cuda").to(dtype)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            timing = _bench(lambda: a @ b, reps=3)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        rates[name] = {"median": 2 * n**3 / (timing["median_ms"] * 1e-3) / 1e12, "unit": "TFLOP/s",
                       "shape": f"{n}x{n}x{n}", **timing}
    return rates


def _rate(timing: dict, nbytes: int) -> dict:
    return {"median": nbytes / (timing["median_ms"] * 1e-3) / 1e9, "unit": "GB/s",
            "bytes_per_run": nbytes, **timing}
