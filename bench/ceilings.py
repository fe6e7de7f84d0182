"""The hardware ceilings that "% of ceiling" divides by: measured by hardware-survey when
results/<gpu>/hardware.json exists, else theoretical peaks from the device's own facts."""
from __future__ import annotations

import json
import warnings


def load(results_dir) -> dict:
    """{"GB/s": DRAM copy bandwidth, "TFLOP/s": {dtype: rate}, "source": "measured" | "theoretical"}."""
    path = results_dir / "hardware.json"
    if path.exists():
        hw = json.loads(path.read_text())
        measured = hw["measured"]
        return {"GB/s": measured["dram_copy_own_gbps"]["median"],
                "TFLOP/s": {k: v["median"] for k, v in measured.get("tensor_tflops", {}).items()},
                "source": "measured"}
    warnings.warn(f"no {path.name} in {results_dir}: % of ceiling uses theoretical peaks "
                  "(run `make survey` for measured ones)")
    return {**theoretical(), "source": "theoretical"}


def theoretical() -> dict:
    """Peak DRAM bandwidth from memory clock and bus width (CuPy exposes both; torch does not)."""
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        gbps = 2 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8 / 1e9  # DDR: x2
    except Exception:  # no CuPy: no bandwidth ceiling
        gbps = None
    return {"GB/s": gbps, "TFLOP/s": {}}
