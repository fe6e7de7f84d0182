"""A ceiling is the best of its probes. Every probe in hardware.json names the ceiling it bounds
from below (a rate something reached on this GPU is a floor for what the GPU can do); the ceiling
is the fastest of them, so no probe, and no library call the bench times the same way, should
reach more than 100% of it. Pure functions over a hardware.json dict, shared by the survey's
report, the roofline and the bench (bench/ceilings.py)."""
from __future__ import annotations

from . import facts as device_facts

# ceiling -> (unit, the theoretical peak it is compared with, what it bounds)
CEILINGS = {
    "dram_copy": ("GB/s", "dram", "read + write streams: copies, elementwise ops, softmax"),
    "dram_read": ("GB/s", "dram", "read-only streams: reductions"),
    "dram_write": ("GB/s", "dram", "write-only streams"),
    "l2_read": ("GB/s", None, "reads of an L2-resident working set (the roofline's L2 roof)"),
    "fp32_fma": ("TFLOP/s", "fp32_fma", "fp32 arithmetic without tensor cores (SGEMM, true-fp32 matmul)"),
    "tensor.bfloat16": ("TFLOP/s", "tensor.bfloat16", "bf16 matmul on tensor cores"),
    "tensor.float16": ("TFLOP/s", "tensor.float16", "fp16 matmul on tensor cores"),
    "tensor.tf32": ("TFLOP/s", "tensor.tf32", "fp32 matmul with TF32 allowed"),
}

# hardware.json from before the probe list (one record per measurement under "measured"):
# read as probes, so committed surveys keep working until `make survey` runs again.
_LEGACY = {"dram_copy_own": ("copy_own", "dram_copy", "median"),
           "dram_copy_torch": ("copy_torch", "dram_copy", "median"),
           "dram_read": ("read_own", "dram_read", "median"),
           "l2_read": ("l2_read_own", "l2_read", "median"),
           "fp32_fma": ("fma_own", "fp32_fma", "tflops")}


def probes(hw: dict) -> dict:
    """{name: {"ceiling", "status", "value", "unit", ...}} from either hardware.json layout."""
    if "probes" in hw:
        return hw["probes"]
    m, found = hw.get("measured", {}), {}
    for key, (name, ceiling, field) in _LEGACY.items():
        if key in m:
            found[name] = {"ceiling": ceiling, "status": "ok", "value": m[key][field],
                           "unit": CEILINGS[ceiling][0], "method": "recorded before the probe list"}
    for short, kind in (("bf16", "bfloat16"), ("fp16", "float16"), ("tf32", "tf32")):
        if short in m.get("tensor", {}):
            found[f"cublas_{kind}_8192"] = {"ceiling": f"tensor.{kind}", "status": "ok", "unit": "TFLOP/s",
                                            "value": m["tensor"][short]["median"],
                                            "method": "recorded before the probe list"}
    return found


def ok(probe: dict) -> bool:
    """A probe counts only if it ran and gave a positive, finite rate."""
    value = probe.get("value")
    return probe.get("status") == "ok" and isinstance(value, (int, float)) and 0 < value < float("inf")


def ceilings(hw: dict) -> dict:
    """{ceiling: {"value", "unit", "probe", "theoretical", "pct_of_theoretical", "bounds"}}: value is
    the best ok probe's rate (None if none ran), probe its name; theoretical from the device facts."""
    peaks = device_facts.theoretical_peaks(hw["facts"]) if "facts" in hw else {}
    all_probes = probes(hw)
    out = {}
    for name, (unit, peak_key, bounds) in CEILINGS.items():
        candidates = {p: r["value"] for p, r in all_probes.items() if r.get("ceiling") == name and ok(r)}
        winner = max(candidates, key=candidates.get) if candidates else None
        value = candidates.get(winner)
        peak = peaks.get(peak_key, {}).get("value") if peak_key else None
        out[name] = {"value": value, "unit": unit, "probe": winner, "theoretical": peak,
                     "pct_of_theoretical": 100 * value / peak if value and peak else None, "bounds": bounds}
    return out
