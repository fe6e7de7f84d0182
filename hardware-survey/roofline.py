"""The roofline: measured ceilings as roofs, every step and reference tier as a point at the op's
arithmetic intensity (flops / minimal bytes) and achieved FLOP/s, from bench.csv."""
from __future__ import annotations

from pathlib import Path

from rosetta.bench.plots import COLORS, plt, save
MARKERS = {"cuda": "o", "triton": "s", "torch": "*", "cub": "P"}


def points(rows: list[dict]) -> list[dict]:
    """Headline rows of each op's first dtype -> {label, backend, intensity, tflops}."""
    import torch

    from rosetta.ops import SPECS

    found = []
    for r in rows:
        spec = SPECS.get(r["op"])
        if not spec or r["status"] != "ok" or r["role"] != "headline":
            continue
        if r["dtype"] != str(spec.dtypes[0]).removeprefix("torch."):
            continue
        shape = tuple(int(s) for s in r["shape"].split("x"))
        flops = spec.flops(shape)
        intensity = flops / spec.minimal_bytes(shape, getattr(torch, r["dtype"]))
        found.append({"label": r["label"], "backend": r["backend"], "intensity": intensity,
                      "tflops": flops / (r["p50_ms"] * 1e-3) / 1e12})
    return found


def _roofs(ax, hardware: dict, xs: list[float]) -> None:
    m = hardware["measured"]
    dram = m["dram_copy_own"]["median"] / 1e3  # TB/s
    l2 = m["l2_read"]["median"] / 1e3
    fma = m["fp32_fma"]["tflops"]
    tensor = m.get("tensor", {}).get("bf16", {}).get("median")
    ax.plot(xs, [min(x * dram, fma) for x in xs], color="tab:red",
            label=f"DRAM {dram:.2f} TB/s | FP32 FMA {fma:.1f} TFLOP/s")
    ax.plot(xs, [min(x * l2, fma) for x in xs], color="tab:orange", linestyle="--", label=f"L2 {l2:.1f} TB/s")
    if tensor:
        ax.plot(xs, [min(x * dram, tensor) for x in xs], color="tab:brown", linestyle=":",
                label=f"bf16 tensor (cuBLAS) {tensor:.0f} TFLOP/s")


def _points(ax, found: list[dict], spread: float, labels: bool) -> None:
    """Every step of an op has the same intensity: fan the points out sideways (by up to
    2^(+-spread/2)) so each can carry its label; a gray line marks the op's true intensity."""
    seen = set()
    by_op = {}
    for p in found:
        by_op.setdefault(p["label"].split("/")[0], []).append(p)
    for op, group in by_op.items():
        ax.axvline(group[0]["intensity"], color="lightgray", linewidth=0.8, zorder=1)
        for i, p in enumerate(group):
            kind = p["backend"]
            x = p["intensity"] * 2 ** (spread * (i / max(len(group) - 1, 1) - 0.5))
            ax.scatter(x, p["tflops"], color=COLORS.get(kind, "gray"), marker=MARKERS.get(kind, "o"),
                       s=50 if kind in ("torch", "cub") else 25, zorder=3, label=None if kind in seen else kind)
            seen.add(kind)
            if labels:
                ax.annotate(p["label"].split("/", 1)[1], (x, p["tflops"]), fontsize=6, rotation=90,
                            xytext=(0, -5), textcoords="offset points", ha="center", va="top")
        if labels:
            ax.annotate(op, (group[0]["intensity"], max(p["tflops"] for p in group)), fontsize=9,
                        xytext=(0, 8), textcoords="offset points", ha="center", color="dimgray")


def plot(hardware: dict, rows: list[dict], path: Path) -> Path:
    """Left: the whole roofline. Right: the memory-bound corner where today's steps sit, zoomed,
    every point labelled."""
    found = points(rows)
    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(16, 7), gridspec_kw={"width_ratios": [1, 1.3]})
    _roofs(whole, hardware, [2.0**k for k in range(-6, 13)])
    _points(whole, found, spread=0.0, labels=False)
    whole.set_ylim(bottom=0.02)
    whole.set_title(f"{hardware['facts']['name']}: measured ceilings, every step (fp32 headline)")
    _roofs(zoom, hardware, [2.0**(k / 4) for k in range(-22, -1)])
    _points(zoom, found, spread=1.2, labels=True)
    zoom.set_xlim(2.0**-5.2, 2.0**-0.6)
    if found:
        zoom.set_ylim(min(p["tflops"] for p in found) / 3, max(p["tflops"] for p in found) * 1.6)
    zoom.set_title("zoom: the memory-bound steps (points fanned out around each op's intensity)")
    for ax in (whole, zoom):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (flop / minimal DRAM byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.grid(True, which="both", alpha=0.3)
    whole.legend(fontsize=8, loc="upper left")
    return save(fig, path, dpi=110)
