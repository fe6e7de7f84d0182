"""Plots made from results files only (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rosetta.ops import SPECS  # noqa: E402

from ..results import order_key, shape_of  # noqa: E402
from ..tier_names import REFERENCE_BACKENDS  # noqa: E402

BACKEND_MAPS = {"cuda": "Greens", "triton": "Blues"}  # one hue per backend, darker = later step
BACKEND_COLORS = {"cuda": "tab:green", "triton": "tab:blue"}  # a backend's line in a sweep
TIER_STYLES = {"eager": ("black", "--"), "compile": ("tab:gray", "-."), "unfused": ("tab:brown", (0, (1, 1.5))),
               "device_reduce": ("tab:purple", ":")}
PEER_COLOR = "tab:orange"
PEER_DASH = (0, (5, 2, 1, 2))
# Colours for series whose own is missing or already taken in the plot (tab:red is the ceiling's)
SPARE_COLORS = (PEER_COLOR, "tab:olive", "tab:cyan", "tab:pink", "tab:brown", "tab:purple", "tab:gray",
                "tab:green", "tab:blue", "black")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")


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


def series_styles(rows: list[dict]) -> list[tuple]:
    """(colour, line style, marker) for each series of one plot, one row standing for each: tiers
    keep their colour and line style (eager black, torch.compile grey, ...), steps their
    backend's hue; a colour already taken in this plot goes to the first spare one that is not,
    and every series gets a marker of its own: no two series look alike."""
    taken, styles = set(), []
    for i, row in enumerate(rows):
        if row["backend"] in REFERENCE_BACKENDS:
            color, style = TIER_STYLES.get(row["name"], (None, PEER_DASH))
        else:
            color, style = BACKEND_COLORS.get(row["backend"]), "-"
        if color is None or color in taken:
            color = next((c for c in SPARE_COLORS if c not in taken), color or "black")
        taken.add(color)
        styles.append((color, style, MARKERS[i % len(MARKERS)]))
    return styles


def sweep_series(rows: list[dict], op: str, direction: str, dtype: str) -> dict[str, dict]:
    """label -> {x: row} for the sweep plot. The series are what the sweep measured (rows of role
    "sweep": the tiers and the best step of each backend); their points are those rows, plus the
    headline rows at a swept shape, which the suite measures once, as a headline, when a headline
    has that shape and dtype (bench/suite.plan). x comes from the spec's sweep axis (softmax: the
    row length, where every swept shape holds the same elements), else the elements (numel)."""
    spec = SPECS[op]
    x_of = spec.sweep_axis.of_shape if spec.sweep_axis else None
    chosen = [r for r in rows if r["op"] == op and r["direction"] == direction and r["dtype"] == dtype
              and r["status"] == "ok"]
    labels = {r["label"] for r in chosen if r["role"] == "sweep"}
    swept_shapes = {"x".join(map(str, s)) for s in spec.sweep}
    series = {}
    for r in sorted(chosen, key=order_key):
        if r["label"] in labels and (r["role"] == "sweep" or (r["role"] == "headline" and r["shape"] in swept_shapes)):
            x = x_of(shape_of(r["shape"])) if x_of else r["numel"]
            points = series.setdefault(r["label"], {})
            if x not in points or r["role"] == "sweep":
                points[x] = r
    return {label: points for label, points in series.items() if len(points) >= 2}


def sweep_plot(rows: list[dict], op: str, direction: str, dtype: str, path: Path,
               ceiling: float | None = None) -> Path | None:
    """Throughput vs size (or the spec's sweep axis) on log-log axes: the best step of each backend
    and the tiers, each series in a colour and marker of its own."""
    swept = sweep_series(rows, op, direction, dtype)
    if not swept:
        return None
    axis = SPECS[op].sweep_axis
    metric = next(iter(next(iter(swept.values())).values()))["metric"]
    fig, ax = plt.subplots(figsize=(10, 5))
    styles = series_styles([next(iter(points.values())) for points in swept.values()])
    for (label, points), (color, style, marker) in zip(swept.items(), styles):
        xs = sorted(points)
        ax.plot(xs, [points[x]["throughput"] for x in xs], linestyle=style, marker=marker, markersize=4,
                color=color, label=label.split("/", 1)[1])
    if ceiling:
        ax.axhline(ceiling, color="tab:red", linewidth=1, label=f"measured ceiling ({ceiling:.0f} {metric})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if axis:
        ax.set_xlabel(axis.label)
        note = axis.note
    else:
        ax.set_xlabel("elements" if metric == "GB/s" else "M x K x N (elements of the output x K)")
        note = "small sizes sit on the ~5 us launch-and-latency floor,\nnot on a bandwidth or compute limit"
    ax.set_ylabel(f"{metric} (log scale)")
    ax.set_title(f"{op} {direction} ({dtype}): throughput vs {axis.name if axis else 'size'}")
    if note:
        ax.text(0.99, 0.02, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="dimgray")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: clear of the lines
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
    tiers = [r for r in chosen if r["backend"] in REFERENCE_BACKENDS]
    for r, (color, style, _) in zip(tiers, series_styles(tiers)):
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
