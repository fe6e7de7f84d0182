"""Device facts (CuPy's cudaGetDeviceProperties, checked against torch's) and the theoretical
peaks that follow from them. The peak arithmetic is pure, so tests run it on recorded facts."""
from __future__ import annotations

import subprocess

FP32_LANES_PER_SM = {9: 128, 8: 64}  # FP32 FMA units per SM by major compute capability (Hopper: 128)


def dram_peak_gbps(memory_clock_mhz: float, bus_width_bits: int) -> float:
    """Peak DRAM bandwidth: double data rate x clock x bus width."""
    return 2 * memory_clock_mhz * 1e6 * bus_width_bits / 8 / 1e9


def theoretical_peaks(facts: dict) -> dict:
    """{name: {"value", "unit", "formula"}} from clocks, bus width and SM count."""
    dram = dram_peak_gbps(facts["memory_clock_mhz"], facts["memory_bus_width_bits"])
    lanes = FP32_LANES_PER_SM.get(int(facts["compute_capability"].split(".")[0]), 64)
    fma = fp32_peak_at(facts, facts["max_sm_clock_mhz"])
    return {
        "dram_gbps": {"value": dram, "unit": "GB/s",
                      "formula": f"2 (DDR) x {facts['memory_clock_mhz']} MHz x {facts['memory_bus_width_bits']} bit / 8"},
        "fp32_fma_tflops": {"value": fma, "unit": "TFLOP/s",
                            "formula": f"{facts['sm_count']} SMs x {lanes} lanes x 2 flop x {facts['max_sm_clock_mhz']} MHz"},
    }


def fp32_peak_at(facts: dict, clock_mhz: float) -> float:
    """FP32 FMA TFLOP/s at a given SM clock (the acceptance compares against the clock measured
    while the microbenchmark ran, not the boost clock)."""
    lanes = FP32_LANES_PER_SM.get(int(facts["compute_capability"].split(".")[0]), 64)
    return facts["sm_count"] * lanes * 2 * clock_mhz * 1e6 / 1e12


def _smi(query: str) -> str:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return out.strip().splitlines()[0] if out.strip() else ""


def collect() -> dict:
    """Everything the survey reports about the device, from CuPy, cross-checked with torch."""
    import cupy
    import torch
    import triton

    rt = cupy.cuda.runtime
    p = rt.getDeviceProperties(0)
    attr = lambda a: rt.deviceGetAttribute(a, 0)  # noqa: E731
    tp = torch.cuda.get_device_properties(0)
    facts = {
        "name": p["name"].decode() if isinstance(p["name"], bytes) else p["name"],
        "compute_capability": f"{p['major']}.{p['minor']}",
        "sm_count": p["multiProcessorCount"],
        "max_sm_clock_mhz": attr(rt.cudaDevAttrClockRate) / 1e3,
        "current_sm_clock_mhz": float(_smi("clocks.sm") or "nan"),
        "memory_gib": round(p["totalGlobalMem"] / 2**30, 2),
        "memory_clock_mhz": attr(rt.cudaDevAttrMemoryClockRate) / 1e3,
        "memory_bus_width_bits": attr(rt.cudaDevAttrGlobalMemoryBusWidth),
        "l2_bytes": p["l2CacheSize"],
        "smem_per_sm_bytes": p["sharedMemPerMultiprocessor"],
        "smem_per_block_bytes": p["sharedMemPerBlock"],
        "smem_per_block_optin_bytes": p["sharedMemPerBlockOptin"],
        "registers_per_sm": p["regsPerMultiprocessor"],
        "max_threads_per_sm": p["maxThreadsPerMultiProcessor"],
        "warp_size": p["warpSize"],
        "driver": _smi("driver_version"),
        "cuda_runtime": torch.version.cuda,
        "cuda_driver_api": rt.driverGetVersion(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cupy": cupy.__version__,
    }
    # The two libraries read the same device: disagreement means a wrong device or a wrong field.
    checks = {"sm_count": tp.multi_processor_count, "compute_capability": f"{tp.major}.{tp.minor}",
              "l2_bytes": tp.L2_cache_size, "name": tp.name}
    facts["torch_agrees"] = all(facts[k] == v for k, v in checks.items())
    return facts
