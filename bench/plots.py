"""Plots made from results files only (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .results import order_key  # noqa: E402
from .tiers import REFERENCE_BACKENDS  # noqa: E402

COLORS = {"cuda": "tab:green", "triton": "tab:blue", "torch": "black", "cub": "tab:purple"}


def save(fig, path: Path, dpi: int = 120) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def sweep_series(rows: list[dict], op: str, dtype: str) -> dict[str, list[tuple]]:
    """label -> [(numel, throughput, backend), ...] sorted by size, in teaching order."""
    series = {}
    for r in sorted(rows, key=order_key):
        if r["op"] == op and r["dtype"] == dtype and r["status"] == "ok":
            series.setdefault(r["label"], []).append((r["numel"], r["throughput"], r["backend"]))
    return {label: sorted(points) for label, points in series.items()}


def sweep_plot(rows: list[dict], op: str, dtype: str, path: Path, ceiling: float | None = None) -> Path | None:
    """Throughput vs size: one line per step (colour by backend), reference tiers dashed."""
    series = sweep_series(rows, op, dtype)
    if not series:
        return None
    metric = next(r["metric"] for r in rows if r["op"] == op)
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in series.items():
        backend = points[0][2]
        reference = backend in REFERENCE_BACKENDS
        shade = 1.0 if reference else 0.35 + 0.65 * int(label.rsplit("/", 1)[1][:2]) / len(series)
        style = {"linestyle": "--" if reference else "-", "marker": "o", "markersize": 3,
                 "color": COLORS[backend], "alpha": min(shade, 1.0)}
        if label.endswith("/compile"):
            style["color"] = "tab:gray"
        ax.plot([p[0] for p in points], [p[1] for p in points], label=label.split("/", 1)[1], **style)
    if ceiling:
        ax.axhline(ceiling, color="tab:red", linewidth=1, label=f"measured ceiling ({ceiling:.0f})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements")
    ax.set_ylabel(metric)
    ax.set_title(f"{op} ({dtype}): throughput vs size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save(fig, path)


def ladder_plot(rows: list[dict], op: str, dtype: str, path: Path, ceiling: float | None = None) -> Path | None:
    """The ladder at the headline shape: a bar per step in teaching order, both backends side by
    side, torch eager / torch.compile as horizontal lines."""
    chosen = sorted((r for r in rows if r["op"] == op and r["dtype"] == dtype and r["role"] == "headline"
                     and r["status"] == "ok"), key=order_key)
    steps = [r for r in chosen if r["backend"] not in REFERENCE_BACKENDS]
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(steps) + 2), 5))
    names = [r["label"].split("/", 1)[1] for r in steps]
    bars = ax.bar(range(len(steps)), [r["throughput"] for r in steps],
                  color=[COLORS[r["backend"]] for r in steps])
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    tier_colors = {"eager": "black", "compile": "tab:gray"}
    for r in chosen:
        if r["backend"] in REFERENCE_BACKENDS:
            ax.axhline(r["throughput"], linestyle="--", color=tier_colors.get(r["name"], COLORS[r["backend"]]),
                       label=f"{r['backend']} {r['name']} ({r['throughput']:.0f})")
    if ceiling:
        ax.axhline(ceiling, color="tab:red", linewidth=1, label=f"measured ceiling ({ceiling:.0f})")
    ax.set_xticks(range(len(steps)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(steps[0]["metric"])
    ax.set_title(f"{op} ladder, {dtype}, shape {steps[0]['shape']}")
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)


def ncu_plot(ncu_rows: list[dict], op: str, metric: str, title: str, path: Path) -> Path | None:
    """One ncu metric per step (the one that explains the ladder), teaching order, by backend."""
    chosen = [r for r in ncu_rows if r["label"].startswith(op + "/") and r.get(metric) is not None]
    if not chosen:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(chosen) + 2), 4.5))
    backends = [r["label"].split("/")[1] for r in chosen]
    bars = ax.bar(range(len(chosen)), [r[metric] for r in chosen], color=[COLORS[b] for b in backends])
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(chosen)), [r["label"].split("/", 1)[1] for r in chosen], rotation=30,
                  ha="right", fontsize=8)
    ax.set_ylabel(title)
    ax.set_title(f"{op}: {title} (Nsight Compute, one launch per step)")
    return save(fig, path)
