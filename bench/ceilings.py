"""The ceilings that "% of ceiling" divides by: measured by `make survey` when
results/<gpu>/hardware.json exists, else theoretical peaks from the device's facts (warned)."""
from __future__ import annotations

import json
import warnings


def load(results_dir) -> dict:
    """{"dram_copy": GB/s, "dram_read": GB/s, "fp32_fma": TFLOP/s, "tensor": {dtype: TFLOP/s},
    "source": "measured" | "theoretical"}; each OpSpec names the one it is measured against."""
    path = results_dir / "hardware.json"
    if path.exists():
        m = json.loads(path.read_text())["measured"]
        return {"dram_copy": m["dram_copy_own"]["median"], "dram_read": m["dram_read"]["median"],
                "fp32_fma": m["fp32_fma"]["tflops"],
                "tensor": {k: v["median"] for k, v in m.get("tensor", {}).items()}, "source": "measured"}
    warnings.warn(f"no {path.name} in {results_dir}: % of ceiling uses theoretical peaks "
                  "(run `make survey` for measured ones)")
    return {**theoretical(), "source": "theoretical"}


def theoretical() -> dict:
    """Peak DRAM bandwidth from memory clock and bus width (CuPy reads both; torch does not)."""
    from rosetta.survey.facts import dram_peak_gbps

    try:
        import cupy

        rt = cupy.cuda.runtime
        gbps = dram_peak_gbps(rt.deviceGetAttribute(rt.cudaDevAttrMemoryClockRate, 0) / 1e3,
                              rt.deviceGetAttribute(rt.cudaDevAttrGlobalMemoryBusWidth, 0))
    except Exception:  # no CuPy: no bandwidth ceiling
        gbps = None
    return {"dram_copy": gbps, "dram_read": gbps, "fp32_fma": None, "tensor": {}}
