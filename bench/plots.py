"""Plots made from results files only (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .results import order_key  # noqa: E402
from .tiers import REFERENCE_BACKENDS  # noqa: E402

BACKEND_MAPS = {"cuda": "Greens", "triton": "Blues"}  # one hue per backend, darker = later step
TIER_STYLES = {"eager": ("black", "--"), "compile": ("tab:gray", "-."), "device_reduce": ("tab:purple", ":")}
PEER_COLOR = "tab:orange"


def save(fig, path: Path, dpi: int = 120) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def step_color(backend: str, step: int, steps: int):
    """Shades of the backend's hue from light (step 1) to dark (the last step): ten steps stay
    distinguishable, and the bar labels name each one anyway."""
    return plt.get_cmap(BACKEND_MAPS.get(backend, "Greys"))(0.35 + 0.6 * step / max(steps, 1))


def tier_style(row) -> tuple[str, str]:
    return TIER_STYLES.get(row["name"], (PEER_COLOR, (0, (5, 2, 1, 2))))


def sweep_plot(rows: list[dict], op: str, direction: str, dtype: str, path: Path,
               ceiling: float | None = None) -> Path | None:
    """Throughput vs size on log-log axes: the best step of each backend and the tiers."""
    series = {}
    for r in sorted(rows, key=order_key):
        if r["op"] == op and r["direction"] == direction and r["dtype"] == dtype and r["status"] == "ok" \
                and r["role"] in ("sweep", "headline"):
            series.setdefault(r["label"], {})[r["numel"]] = (r["throughput"], r)
    swept = {label: pts for label, pts in series.items() if len(pts) > 2}
    if not swept:
        return None
    metric = next(iter(next(iter(swept.values())).values()))[1]["metric"]
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for label, points in swept.items():
        xs = sorted(points)
        row = points[xs[0]][1]
        if row["backend"] in REFERENCE_BACKENDS:
            color, style = tier_style(row)
        else:
            color, style = step_color(row["backend"], 1, 1), "-"
        ax.plot(xs, [points[x][0] for x in xs], linestyle=style, marker="o", markersize=3, color=color,
                label=label.split("/", 1)[1])
    if ceiling:
        ax.axhline(ceiling, color="tab:red", linewidth=1, label=f"measured ceiling ({ceiling:.0f} {metric})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("elements" if metric == "GB/s" else "M x K x N (elements of the output x K)")
    ax.set_ylabel(f"{metric} (log scale)")
    ax.set_title(f"{op} {direction} ({dtype}): throughput vs size")
    ax.text(0.99, 0.02, "small sizes sit on the ~5 us launch-and-latency floor,\nnot on a bandwidth or compute limit",
            transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="dimgray")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return save(fig, path)


def ladder_plot(rows: list[dict], op: str, direction: str, shape: str, dtype: str, path: Path,
                ceiling: float | None = None) -> Path | None:
    """The ladder at one headline: a bar per step in teaching order (colour: backend, shade: step),
    each labelled with its throughput inside the bar; tiers as lines labelled in the legend."""
    chosen = sorted((r for r in rows if r["op"] == op and r["direction"] == direction and r["dtype"] == dtype
                     and r["shape"] == shape and r["role"] == "headline" and r["status"] == "ok"), key=order_key)
    steps = [r for r in chosen if r["backend"] not in REFERENCE_BACKENDS]
    if not steps:
        return None
    metric = steps[0]["metric"]
    counts = {b: max(r["step"] for r in steps if r["backend"] == b) for b in {r["backend"] for r in steps}}
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(steps) + 3), 5))
    bars = ax.bar(range(len(steps)), [r["throughput"] for r in steps],
                  color=[step_color(r["backend"], r["step"], counts[r["backend"]]) for r in steps])
    top = max([r["throughput"] for r in chosen] + [ceiling or 0])
    for bar, r in zip(bars, steps):  # inside the bar, vertical: clear of the reference lines
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() * 0.03, f"{r['throughput']:.0f}",
                ha="center", va="bottom", rotation=90, fontsize=7, color="white" if r["step"] > 2 else "black")
    for r in chosen:
        if r["backend"] in REFERENCE_BACKENDS:
            color, style = tier_style(r)
            ax.axhline(r["throughput"], linestyle=style, color=color, linewidth=1.2,
                       label=f"{r['backend']} {r['name']}: {r['throughput']:.0f}")
    if ceiling:
        ax.axhline(ceiling, color="tab:red", linewidth=1, label=f"measured ceiling: {ceiling:.0f}")
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(range(len(steps)), [r["label"].split("/", 1)[1] for r in steps], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(f"{op} {direction}, {dtype}, {shape}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save(fig, path)


def ncu_plot(ncu_rows: list[dict], op: str, metric: str, title: str, path: Path) -> Path | None:
    """One ncu metric per step (the one that explains the ladder), teaching order, by backend."""
    chosen = [r for r in ncu_rows if r["label"].startswith(op + "/") and r.get(metric) is not None]
    if not chosen:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(chosen) + 2), 4.5))
    backends = [r["label"].split("/")[1] for r in chosen]
    colors = [step_color(b, i + 1, len(chosen)) if b in BACKEND_MAPS else "black" for i, b in enumerate(backends)]
    bars = ax.bar(range(len(chosen)), [r[metric] for r in chosen], color=colors)
    ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(chosen)), [r["label"].split("/", 1)[1] for r in chosen], rotation=35,
                  ha="right", fontsize=7)
    ax.set_ylabel(title)
    ax.set_title(f"{op}: {title} (Nsight Compute, one launch per step)")
    return save(fig, path)
