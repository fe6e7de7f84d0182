"""The ceilings that "% of ceiling" divides by: the best probe `make survey` measured for each
(results/<gpu>/hardware.json; see rosetta.survey.best), with the theoretical peak beside it. With no
hardware.json the theoretical peaks stand in for both (warned)."""
from __future__ import annotations

import json
import warnings

from rosetta.survey import best
from rosetta.survey import facts as device_facts

COMPUTE = ("fp32_fma", "tensor")  # spec ceilings where the dtype picks the unit that does the work


def load(results_dir) -> dict:
    """{"dram_copy", "dram_read", "dram_write", "l2_read": GB/s, "fp32_fma": TFLOP/s,
    "tensor": {"bfloat16", "float16", "tf32", "float32" (= fp32_fma): TFLOP/s},
    "theoretical": {the same keys}, "best": {ceiling: winning probe}, "source": "measured" | "theoretical"};
    a value is None where nothing measured it (or no peak is known)."""
    path = results_dir / "hardware.json"
    if path.exists():
        return {**from_hardware(json.loads(path.read_text())), "source": "measured"}
    warnings.warn(f"no {path.name} in {results_dir}: % of ceiling uses theoretical peaks "
                  "(run `make survey` for measured ones)")
    return {**theoretical(), "source": "theoretical"}


def from_hardware(hw: dict) -> dict:
    c = best.ceilings(hw)
    return {**_nest({k: v["value"] for k, v in c.items()}),
            "theoretical": _nest({k: v["theoretical"] for k, v in c.items()}),
            "best": {k: v["probe"] for k, v in c.items()}}


def theoretical() -> dict:
    """Peaks from this device's facts (CuPy reads memory clock and bus width); None without CuPy."""
    try:
        peaks = device_facts.theoretical_peaks(device_facts.collect())
        flat = {k: peaks[key]["value"] if key else None
                for k, (_, key, _) in best.CEILINGS.items()}
    except Exception:  # no CuPy or no GPU: no ceilings
        flat = dict.fromkeys(best.CEILINGS)
    return {**_nest(flat), "theoretical": _nest(flat), "best": {}}


def _nest(flat: dict) -> dict:
    """Flat ceiling names ("tensor.bfloat16") -> the bench's layout (limits["tensor"]["bfloat16"]);
    tensor["float32"] is the FP32 FMA ceiling: a true-fp32 matmul runs on the FMA pipes."""
    out = {k: v for k, v in flat.items() if not k.startswith("tensor.")}
    out["tensor"] = {k.removeprefix("tensor."): v for k, v in flat.items() if k.startswith("tensor.")}
    out["tensor"]["float32"] = flat.get("fp32_fma")
    return out


def ceiling_for(limits: dict, spec_ceiling: str, dtype_name: str) -> tuple:
    """(measured, theoretical) for an op's `spec.ceiling` at a dtype ("float32", "bfloat16", ...).
    "dram_copy" / "dram_read" / "dram_write": the bandwidth, whatever the dtype. "fp32_fma" or
    "tensor" (compute-bound ops, i.e. matmul): the dtype picks the unit — float32 the FP32 FMA
    ceiling, half types their tensor-core ceiling. Either is None where unknown (no % then)."""
    def pick(table):
        if not table:
            return None
        if spec_ceiling in COMPUTE:
            tensor = table.get("tensor") or {}
            return tensor.get(dtype_name, table.get("fp32_fma") if dtype_name == "float32" else None)
        return table.get(spec_ceiling)

    return pick(limits), pick((limits or {}).get("theoretical"))


def summary(limits: dict) -> str:
    """One line for the README and the bench's banner: each ceiling, its best probe, % of peak."""
    t, b = limits.get("theoretical") or {}, limits.get("best") or {}
    rows = [(label, limits.get(k), t.get(k), "GB/s", b.get(k), ",.0f") for k, label in
            (("dram_copy", "DRAM copy"), ("dram_read", "read"), ("dram_write", "write"))]
    rows.append(("FP32 FMA", limits.get("fp32_fma"), t.get("fp32_fma"), "TFLOP/s", b.get("fp32_fma"), ".1f"))
    tensor, tensor_t = limits.get("tensor") or {}, t.get("tensor") or {}
    rows += [(f"{k} tensor", tensor.get(k), tensor_t.get(k), "TFLOP/s", b.get(f"tensor.{k}"), ",.0f")
             for k in ("bfloat16", "float16", "tf32") if tensor.get(k) is not None]
    parts = []
    for label, measured, peak, unit, probe, fmt in rows:
        if measured is None:
            parts.append(f"{label} –")
            continue
        notes = [n for n in (probe, f"{100 * measured / peak:.0f}% of {peak:{fmt}} theoretical" if peak else None) if n]
        parts.append(f"{label} {measured:{fmt}} {unit}" + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(parts)


def apply_to_rows(rows: list[dict], limits: dict, specs: dict) -> None:
    """Set each row's "% of measured ceiling" and "% of theoretical peak". The measured ceiling of a
    group (op, direction, dtype, shape, input layout) is the best of the survey's probes and of the library
    kernels measured on the same inputs in the same run (torch, CUB, Liger): a vendor kernel is a
    probe of that exact traffic, including what part of a small output stays dirty in L2 when the
    kernel ends, which the survey's 1 GB probes cannot see. A ceiling is a bound: where one of our
    own steps beat all of those (the survey's copy probe and vector_add's Triton step are the same
    kernel, so they tie within run-to-run noise), the fastest row of the group is the ceiling, so no
    "% of measured ceiling" passes 100."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r.get("direction"), r["dtype"], r["shape"], r.get("layout") or ""), []).append(r)
    for (op, _, dtype, *_), members in groups.items():
        measured, theoretical = ceiling_for(limits, specs[op].ceiling, dtype)
        seen = [r["throughput"] for r in members if r.get("throughput")]
        ceiling = max([c for c in (measured, *seen) if c] or [None]) if measured or seen else None
        for r in members:
            r["pct_of_ceiling"] = 100 * r["throughput"] / ceiling if ceiling and r.get("throughput") else None
            r["pct_of_theoretical"] = (100 * r["throughput"] / theoretical
                                       if theoretical and r.get("throughput") else None)
