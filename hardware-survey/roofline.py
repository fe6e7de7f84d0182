"""The roofline: the measured ceilings as roofs, every step and reference tier as a point at its op's
true arithmetic intensity (flops / minimal DRAM bytes) and achieved TFLOP/s, from bench.csv.
Points never move (a point moved sideways sits under a different roof); labels move instead."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from . import best  # noqa: E402
from .labels import place_labels  # noqa: E402

DPI = 110
COLORS = {"torch": "black", "cub": "tab:purple", "cuda": "tab:green", "triton": "tab:blue"}
MARKERS = {"cuda": "o", "triton": "s", "torch": "*", "cub": "P"}


def read_rows(path: Path) -> list[dict]:
    """bench.csv as plain dicts (points() converts what it needs): the survey reads the bench's
    file, it does not import the bench."""
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def points(rows: list[dict]) -> list[dict]:
    """Headline rows of each op's first dtype, both directions -> {label, op, direction, backend,
    shape, intensity, tflops}; intensity and flops from the op's spec, time from the row."""
    import torch

    from rosetta.ops import SPECS

    found = []
    for r in rows:
        spec, direction = SPECS.get(r["op"]), r.get("direction") or "forward"
        if not spec or r["status"] != "ok" or r["role"] != "headline" or not r.get("p50_ms"):
            continue
        d = spec.directions().get(direction)
        if d is None or r["dtype"] != str(spec.dtypes[0]).removeprefix("torch."):
            continue
        shape = tuple(int(s) for s in str(r["shape"]).split("x"))
        flops = d.flops(shape)
        found.append({"label": r["label"], "op": r["op"], "direction": direction, "backend": r["backend"],
                      "shape": r["shape"], "intensity": flops / d.minimal_bytes(shape, getattr(torch, r["dtype"])),
                      "tflops": flops / (float(r["p50_ms"]) * 1e-3) / 1e12})
    return found


def _roofs(ax, ceilings: dict, xs: list[float]) -> None:
    value = lambda k: ceilings.get(k, {}).get("value")  # noqa: E731
    fma = value("fp32_fma") or float("inf")
    for key, color, style, what in (("dram_copy", "tab:red", "-", "DRAM copy"), ("dram_read", "tab:pink", "-.", "DRAM read"),
                                    ("l2_read", "tab:orange", "--", "L2 read")):
        if value(key):
            tbps = value(key) / 1e3
            ax.plot(xs, [min(x * tbps, fma) for x in xs], color=color, linestyle=style, linewidth=1,
                    label=f"{what} {tbps:.2f} TB/s ({ceilings[key]['probe']})")
    if value("fp32_fma"):
        ax.axhline(fma, color="tab:red", linewidth=0.6, alpha=0.5, label=f"FP32 FMA {fma:.1f} TFLOP/s")
    if value("tensor.bfloat16") and value("dram_copy"):
        tensor, tbps = value("tensor.bfloat16"), value("dram_copy") / 1e3
        ax.plot(xs, [min(x * tbps, tensor) for x in xs], color="tab:brown", linestyle=":",
                label=f"bf16 tensor {tensor:.0f} TFLOP/s ({ceilings['tensor.bfloat16']['probe']})")


def _scatter(ax, found: list[dict], highlight: set | None = None) -> None:
    """One scatter per backend, at the points' true (intensity, tflops); with `highlight` (ids of
    the labelled points) the others are drawn faint."""
    for kind in dict.fromkeys(p["backend"] for p in found):
        group = [p for p in found if p["backend"] == kind]
        for faint in (False, True):
            chosen = [p for p in group if (highlight is not None and id(p) not in highlight) == faint]
            if chosen:
                ax.scatter([p["intensity"] for p in chosen], [p["tflops"] for p in chosen],
                           color=COLORS.get(kind, "tab:orange"), marker=MARKERS.get(kind, "D"),
                           s=50 if kind == "torch" else 22, alpha=0.35 if faint else 1.0, zorder=3,
                           label=None if faint else kind)


def _groups(found: list[dict]) -> dict:
    by = {}
    for p in found:
        by.setdefault((p["op"], p["direction"]), []).append(p)
    return by


def figure(hardware: dict, rows: list[dict]):
    """Left: the whole roofline. Right: the memory-bound corner, zoomed, each step's best headline
    labelled (labels placed clear of each other, with a leader line back to the point)."""
    found, ceilings = points(rows), best.ceilings(hardware)
    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(18, 8), dpi=DPI, gridspec_kw={"width_ratios": [1, 1.5]})
    _roofs(whole, ceilings, [2.0**k for k in range(-6, 13)])
    _scatter(whole, found)
    whole.set_title(f"{hardware['facts']['name']}: measured ceilings, every headline ({'/'.join(sorted({p['op'] for p in found}))})",
                    fontsize=9)
    dram, fma = ceilings["dram_copy"]["value"], ceilings["fp32_fma"]["value"]
    ridge = fma / (dram / 1e3) if dram and fma else 4.0
    near = [p for p in found if p["intensity"] < ridge]
    labelled = {}
    for p in near:  # each step's fastest headline per direction carries the label
        key = (p["label"], p["direction"])
        labelled[key] = max(labelled.get(key, p), p, key=lambda q: q["tflops"])
    _scatter(zoom, near, highlight={id(p) for p in labelled.values()})
    lo, hi = (min(p["intensity"] for p in near), max(p["intensity"] for p in near)) if near else (2**-4, 1.0)
    _roofs(zoom, ceilings, [lo / 4 * 2.0**(k / 8) for k in range(int(8 * math.log2(16 * hi / lo)) + 2)])
    zoom.set_xlim(lo / 3, hi * 3)
    if near:
        zoom.set_ylim(min(p["tflops"] for p in near) / 4, max(p["tflops"] for p in near) * 4)
    zoom.set_title("zoom: memory-bound headlines at their true intensity (faint: the same step at other shapes)",
                   fontsize=9)
    for ax in (whole, zoom):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (flop / minimal DRAM byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.grid(True, which="both", alpha=0.3)
    whole.legend(fontsize=7, loc="upper left")
    fig.tight_layout()  # before the labels: they are placed in the final pixel layout
    names = []
    for (op, direction), group in _groups(near).items():
        zoom.axvline(group[0]["intensity"], color="lightgray", linewidth=0.8, zorder=1)
        names.append(zoom.text(group[0]["intensity"], 0.01, f"{op} {direction}", rotation=90, fontsize=8,
                               color="dimgray", ha="right", va="bottom",
                               transform=blended_transform_factory(zoom.transData, zoom.transAxes)))
    place_labels(zoom, [(p["intensity"], p["tflops"], _text(p)) for p in labelled.values()],
                 [(p["intensity"], p["tflops"]) for p in near], names)
    return fig


def _text(p: dict) -> str:
    return p["label"].split("/", 1)[1] + (" (backward)" if p["direction"] == "backward" else "")


def plot(hardware: dict, rows: list[dict], path: Path) -> Path:
    fig = figure(hardware, rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)  # no tight_layout here: it would move the axes under placed labels
    plt.close(fig)
    return path
