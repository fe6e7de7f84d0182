"""The probes. Each measures one rate with the project's one timing method (rosetta.timing: the call
replayed as a CUDA graph, the L2 flushed cleanly before every replay, median of many replays),
the same method the bench times its steps with, so a ceiling and the rows divided by it are
comparable. Own kernels come from kernels.cu via CuPy's RawModule (NVRTC); buffers are torch
tensors shared with CuPy through DLPack. A probe that fails is recorded as failed, never fatal."""
from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

from rosetta import timing

KERNELS = Path(__file__).with_name("kernels.cu")
THREADS = 256
N = 2**28  # fp32 elements per buffer (1 GiB): the bench's vector_add / reduce_sum headline size
GEMM_SIZES = (4096, 8192)
GEMMS = (("bfloat16", torch.bfloat16, False), ("float16", torch.float16, False),
         ("tf32", torch.float32, True), ("float32", torch.float32, False))


class Probes:
    """Runs probes one by one into `found` ({name: record}); see best.py for how they combine."""

    def __init__(self, flush: timing.Flush):
        self.flush, self.found = flush, {}

    def run(self, name: str, ceiling: str, work: float, unit: str, method: str, fn, check=None):
        scale = 1e9 if unit == "GB/s" else 1e12
        try:
            # compute rates swing a few % with the clock (power, heat): the best of three timings
            runs = [timing.measure(fn, self.flush) for _ in range(3 if unit == "TFLOP/s" else 1)]
            t = {**min(runs, key=lambda r: r["p50_ms"]), "p50_ms_runs": [r["p50_ms"] for r in runs]}
            torch.cuda.synchronize()
            if check is not None and not check():
                raise AssertionError("the probe computed a wrong result")
            record = {"ceiling": ceiling, "status": "ok", "value": work / (t["p50_ms"] * 1e-3) / scale,
                      "unit": unit, "work_per_call": work, **t,
                      "sm_clock_mhz_during": _clock_under(fn, t["p50_ms"]) if unit == "TFLOP/s" else None}
            print(f"  {name:22s} {record['value']:9.1f} {unit:8s} ({t['timing']}, {t['reps']} replays)", flush=True)
        except Exception as exc:  # a failed probe is reported, the survey goes on
            record = {"ceiling": ceiling, "status": f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]}
            print(f"  {name:22s} {record['status']}", flush=True)
        self.found[name] = {**record, "method": method}
        return record


def _clock_under(fn, call_ms: float):
    """The SM clock (NVML via torch, every 10 ms) while fn runs back to back for ~200 ms: sustained
    load can lower it, and a FLOP/s figure means little without its clock. Sampled after the
    timing, not during it: a second thread calling into the driver can break a graph capture."""
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            try:
                clocks.append(torch.cuda.clock_rate(0))
            except Exception:  # no pynvml / NVML: no clock; the rate still counts
                return
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for _ in range(max(1, int(200 / max(call_ms, 1e-3)))):
            fn()
        torch.cuda.synchronize()
    finally:
        stop.set()
        sampler.join()
    return statistics.median(clocks) if clocks else None


def _module():
    import cupy

    return cupy.RawModule(code=KERNELS.read_text(), options=("-std=c++17",))


def _cupy(t):
    import cupy

    return cupy.from_dlpack(t)  # zero-copy: the same device memory torch allocated


def _launcher(kernel, grid, args):
    """A CuPy launch on torch's *current* stream (the capture stream while a graph is captured):
    CuPy's own default stream is the legacy one, which graph capture refuses."""
    import cupy

    def launch():
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((grid,), (THREADS,), args)
    return launch


def bandwidth(p: Probes) -> None:
    """DRAM read+write, read-only and write-only probes on 1 GiB buffers, then L2 reads."""
    nbytes, n4 = N * 4, N // 4
    src, other = torch.rand(N, device="cuda"), torch.rand(N, device="cuda")
    dst, sink = torch.empty_like(src), torch.empty((), device="cuda")
    same = lambda: torch.equal(dst, src)  # noqa: E731
    try:
        import cupy

        mod = _module()
        s, d = _cupy(src), _cupy(dst)
        # CuPy passes Python ints as 64-bit and floats as double: give each argument its C type
        copy = _launcher(mod.get_function("copy_f4"), n4 // (THREADS * 4), (s, d, np.int64(n4)))
        read = _launcher(mod.get_function("read_f4"), _sms() * 8, (s, np.int64(n4), np.int32(1), _cupy(sink)))
        write = _launcher(mod.get_function("write_f4"), n4 // (THREADS * 4), (d, np.int64(n4), np.float32(1.5)))
        rt = cupy.cuda.runtime
        memcpy = lambda: rt.memcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes, rt.memcpyDeviceToDevice,  # noqa: E731
                                        torch.cuda.current_stream().cuda_stream)
    except Exception as exc:  # no CuPy / NVRTC: the torch probes still run
        copy = read = write = memcpy = _failing(exc)
    try:
        from . import stream_triton as st

        st.add(src, other, dst), st.copy(src, dst), st.total(src, sink.zero_())  # autotune outside any capture
        t_add, t_copy = (lambda: st.add(src, other, dst)), (lambda: st.copy(src, dst))
        t_sum = lambda: st.total(src, sink)  # noqa: E731 -- the sum's value is not checked, only its time
    except Exception as exc:
        t_add = t_copy = t_sum = _failing(exc)
    p.run("copy_own", "dram_copy", 2 * nbytes, "GB/s", "copy_f4 (kernels.cu): 16 B vectors, 4 loads in "
          "flight per thread before the stores; read + write", copy, check=same)
    p.run("copy_torch", "dram_copy", 2 * nbytes, "GB/s", "dst.copy_(src), 1 GiB fp32; read + write", lambda: dst.copy_(src))
    p.run("memcpy_d2d", "dram_copy", 2 * nbytes, "GB/s", "cudaMemcpyAsync device-to-device (CuPy runtime); "
          "read + write", memcpy, check=same)
    p.run("add_torch", "dram_copy", 3 * nbytes, "GB/s", "torch.add(x, y, out=z), fp32 2^28: 2 reads + 1 write",
          lambda: torch.add(src, other, out=dst))
    p.run("add_triton", "dram_copy", 3 * nbytes, "GB/s", "Triton add (stream_triton.py), BLOCK x warps "
          "autotuned: 2 reads + 1 write", t_add)
    p.run("copy_triton", "dram_copy", 2 * nbytes, "GB/s", "Triton copy (stream_triton.py), autotuned; read + write",
          t_copy, check=same)
    p.run("read_own", "dram_read", nbytes, "GB/s", "read_f4 (kernels.cu): 1 GiB read once, 4 x 16 B loads "
          "in flight, result kept live by a never-taken store", read)
    p.run("sum_torch", "dram_read", nbytes, "GB/s", "torch.sum(x, dim=0, out=s), fp32 2^28", lambda: torch.sum(src, dim=0, out=sink))
    p.run("sum_triton", "dram_read", nbytes, "GB/s", "Triton sum (stream_triton.py): one BLOCK load and one "
          "atomic per program, autotuned", t_sum)
    p.run("write_own", "dram_write", nbytes, "GB/s", "write_f4 (kernels.cu): 16 B stores, one-shot blocks", write,
          check=lambda: bool((dst == 1.5).all()))
    p.run("fill_torch", "dram_write", nbytes, "GB/s", "dst.fill_(2.0), 1 GiB fp32", lambda: dst.fill_(2.0))
    del src, other, dst
    torch.cuda.empty_cache()
    l2 = torch.rand(4 * 2**20, device="cuda")  # 16 MiB: well inside the 50 MiB L2
    try:
        l2_read = _launcher(_module().get_function("read_f4"), _sms() * 8,
                            (_cupy(l2), np.int64(l2.numel() // 4), np.int32(64), _cupy(sink)))
    except Exception as exc:
        l2_read = _failing(exc)
    p.run("l2_read_own", "l2_read", 64 * l2.numel() * 4, "GB/s", "read_f4 over 16 MiB 64 times in one launch; the "
          "first pass after the flush comes from DRAM (1/64 of the bytes)", l2_read)


def compute(p: Probes) -> None:
    """FP32 FMA chains, mma.sync chains (bf16, fp16), and cuBLAS at 4096^3 and 8192^3."""
    sms = _sms()
    try:
        mod = _module()
    except Exception as exc:
        mod = exc
    blocks, iters = sms * 8, 4096
    out = torch.empty(blocks * THREADS, device="cuda")
    fma = _own(mod, "fma_chains", blocks, (lambda o: (o, np.int32(iters), np.float32(0.9999), np.float32(1e-4))), out)
    p.run("fma_own", "fp32_fma", blocks * THREADS * iters * 16 * 8 * 2, "TFLOP/s", "fma_chains (kernels.cu): "
          "8 x SMs blocks x 256 threads, 8 independent FFMA chains, 128 FFMA per iteration (SASS checked)",
          fma, check=lambda: bool(torch.isfinite(out).all()))
    blocks, iters = sms * 4, 4096  # __launch_bounds__(256, 4): exactly one wave
    for kind, name, bits in (("bfloat16", "mma_bf16_chains", 0x3C003C00), ("float16", "mma_f16_chains", 0x3C003C00)):
        mma = _own(mod, name, blocks, (lambda o: (o, np.int32(iters), np.uint32(bits))), out)
        p.run(f"mma_sync_{kind}", f"tensor.{kind}", blocks * 8 * iters * 32 * 4096, "TFLOP/s",
              f"{name} (kernels.cu): mma.sync m16n8k16 {kind} -> fp32, 8 register-resident chains per warp, "
              "no memory traffic", mma, check=lambda: bool(torch.isfinite(out).all()))
    for kind, dtype, tf32 in GEMMS:
        for n in GEMM_SIZES:
            a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
            c = torch.empty(n, n, device="cuda", dtype=dtype)
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32  # read at capture: the graph keeps the kernel chosen
            try:
                p.run(f"cublas_{kind}_{n}", "fp32_fma" if kind == "float32" else f"tensor.{kind}", 2 * n**3,
                      "TFLOP/s", f"torch.mm (cuBLAS) {n}^3 {'fp32, TF32 allowed' if tf32 else dtype}"
                      + (" with TF32 off (SGEMM)" if kind == "float32" else ""), lambda: torch.mm(a, b, out=c))
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
            del a, b, c
    torch.cuda.empty_cache()


def _own(mod, name, blocks, make_args, out):
    if isinstance(mod, Exception):
        return _failing(mod)
    try:
        return _launcher(mod.get_function(name), blocks, make_args(_cupy(out)))
    except Exception as exc:
        return _failing(exc)


def _failing(exc):
    def fail():
        raise RuntimeError(f"kernel not available: {type(exc).__name__}: {exc}")
    return fail


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count
