"""Device facts (CuPy's cudaGetDeviceProperties, checked against torch's) and the theoretical
peaks that follow from them. The peak arithmetic is pure, so tests run it on recorded facts."""
from __future__ import annotations

import subprocess

# FP32 FMA lanes per SM: "32-bit floating-point add, multiply, multiply-add" results per clock per
# SM, CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table; the architecture
# whitepapers agree (GA102: the second FP32 datapath of sm_86; AD102; GH100: 128 FP32 cores per SM;
# Blackwell B200 and RTX 50: 128). It depends on the minor version too: sm_80 (A100) has 64 lanes,
# sm_86/87/89 have 128.
FP32_LANES_PER_SM = {
    (6, 0): 64, (6, 1): 128, (6, 2): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64,
    (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128,
    (10, 0): 128, (10, 3): 128, (11, 0): 128, (12, 0): 128, (12, 1): 128,
}
# Dense tensor-core flop per clock per SM (an FMA is 2 flop), from the whitepapers' peaks:
# A100 (sm_80): 312 TFLOP/s bf16/fp16 at 1410 MHz on 108 SMs = 2048; tf32 156 = 1024.
# H100 SXM (sm_90): 989.4 TFLOP/s bf16/fp16 at 1830 MHz on 132 SMs = 4096 (1024 FMA); tf32 494.7 = 2048.
# Other architectures are left out rather than guessed (consumer parts halve fp32-accumulate rates).
TENSOR_FLOP_PER_CLK_SM = {
    (8, 0): {"bfloat16": 2048, "float16": 2048, "tf32": 1024},
    (9, 0): {"bfloat16": 4096, "float16": 4096, "tf32": 2048},
}


def _cc(facts_or_cc) -> tuple[int, int]:
    cc = facts_or_cc["compute_capability"] if isinstance(facts_or_cc, dict) else facts_or_cc
    major, minor = str(cc).split(".")
    return int(major), int(minor)


def fp32_lanes_per_sm(compute_capability: str) -> int | None:
    """Lanes for "9.0"-style versions; an unlisted minor takes its major's nearest lower listed
    one (a variant keeps its family's SM); an unknown major gives None (no guessed peak)."""
    major, minor = _cc(compute_capability)
    known = [m for (ma, m) in FP32_LANES_PER_SM if ma == major and m <= minor]
    return FP32_LANES_PER_SM[(major, max(known))] if known else None


def dram_peak_gbps(memory_clock_mhz: float, bus_width_bits: int) -> float:
    """Peak DRAM bandwidth: double data rate x clock x bus width."""
    return 2 * memory_clock_mhz * 1e6 * bus_width_bits / 8 / 1e9


def fp32_peak_at(facts: dict, clock_mhz: float) -> float | None:
    """FP32 FMA TFLOP/s at a given SM clock (the FMA probe is also compared against the clock
    measured while it ran, not only the boost clock)."""
    lanes = fp32_lanes_per_sm(facts["compute_capability"])
    return None if lanes is None else facts["sm_count"] * lanes * 2 * clock_mhz * 1e6 / 1e12


def tensor_peak_tflops(facts: dict, kind: str) -> float | None:
    """Dense tensor-core TFLOP/s at the device's max SM clock; None where the table has no entry."""
    per_clk = TENSOR_FLOP_PER_CLK_SM.get(_cc(facts), {}).get(kind)
    return None if per_clk is None else facts["sm_count"] * per_clk * facts["max_sm_clock_mhz"] * 1e6 / 1e12


def theoretical_peaks(facts: dict) -> dict:
    """{name: {"value", "unit", "formula"}}; value None where the arithmetic is unknown. Names:
    "dram", "fp32_fma", "tensor.bfloat16", "tensor.float16", "tensor.tf32"."""
    sms, clock = facts["sm_count"], facts["max_sm_clock_mhz"]
    peaks = {
        "dram": {"value": dram_peak_gbps(facts["memory_clock_mhz"], facts["memory_bus_width_bits"]),
                 "unit": "GB/s",
                 "formula": f"2 (DDR) x {facts['memory_clock_mhz']} MHz x {facts['memory_bus_width_bits']} bit / 8"},
        "fp32_fma": {"value": fp32_peak_at(facts, clock), "unit": "TFLOP/s",
                     "formula": f"{sms} SMs x {fp32_lanes_per_sm(facts['compute_capability'])} FP32 lanes "
                                f"x 2 flop x {clock} MHz"},
    }
    for kind in ("bfloat16", "float16", "tf32"):
        per_clk = TENSOR_FLOP_PER_CLK_SM.get(_cc(facts), {}).get(kind)
        peaks[f"tensor.{kind}"] = {"value": tensor_peak_tflops(facts, kind), "unit": "TFLOP/s",
                                   "formula": f"{sms} SMs x {per_clk} dense flop/clk x {clock} MHz" if per_clk
                                   else f"no dense tensor-core figure for sm_{''.join(map(str, _cc(facts)))}"}
    return peaks


def _smi(query: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
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
