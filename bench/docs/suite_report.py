"""The shape suite's results as a summary, a per-case table and heatmaps (results/<gpu>/suite.md,
plots/suite_<op>.png), made from suite.csv alone (no GPU needed).

Per op and backend: the dispatched step's kernel time (CUDA-graph replays) against torch's on every
case (geometric mean of torch / ours, the share of cases at >= 0.9x, the worst case); the same for
the eager calls, over every case and over those where torch's own call takes >= 20 us (below that
the call's host cost is the story: `--overhead`); and how close step=None came to the fastest step.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

import rosetta  # noqa: E402
from rosetta.ops import SPECS  # noqa: E402

from ..results import shape_of  # noqa: E402
from .plots import save  # noqa: E402

EAGER_FLOOR_MS = 0.020  # torch's own call at least this long: the eager target applies
GOOD = 0.9  # a case at >= this ratio to torch counts as held
DISPATCH_SLACK = 1.03  # step=None within 3% of the fastest step


def cases(rows: list[dict]) -> dict:
    """(op, dtype, shape) -> {"torch": {run: graph ms}, "torch_call": {run: eager ms},
    "eager": {backend: (step, ms, run)}, "run": {backend: run}, backend: {step: ms}}. A backend's
    suite can be re-run alone (`--suite --backend`): each run keeps its own torch rows, and every
    ratio takes torch's time from the run that timed the step."""
    found: dict = {}
    for r in rows:
        if r["status"] != "ok" or r["role"] not in ("suite", "suite-eager"):
            continue
        case = found.setdefault((r["op"], r["dtype"], r["shape"]),
                                {"torch": {}, "torch_call": {}, "eager": {}, "run": {}})
        run = r.get("git_sha")
        if r["role"] == "suite-eager":
            if r["backend"] == "torch":
                case["torch_call"][run] = r["p50_ms"]
            else:
                case["eager"][r["backend"]] = (r["step"], r["p50_ms"], run)
        elif r["backend"] == "torch":
            case["torch"][run] = r["p50_ms"]
        elif r["backend"] in rosetta.BACKENDS:
            case.setdefault(r["backend"], {})[r["step"]] = r["p50_ms"]
            case["run"][r["backend"]] = run
    return found


def per_case(rows: list[dict], op: str, backend: str) -> list[dict]:
    """One record per case of op where torch and the backend both ran in one run: graph and eager
    ratios (torch / ours: > 1 is faster than torch), the dispatched and the fastest step."""
    out = []
    for (o, dtype, shape), c in sorted(cases(rows).items(), key=lambda kv: (kv[0][1], shape_of(kv[0][2]))):
        steps = c.get(backend)
        if o != op or not steps or c["run"][backend] not in c["torch"] or backend not in c["eager"]:
            continue
        torch_ms = c["torch"][c["run"][backend]]
        chosen, call_ms, eager_run = c["eager"][backend]
        fastest = min(steps, key=steps.get)
        mine = steps.get(chosen)
        torch_call = c["torch_call"].get(eager_run, math.nan)
        out.append({"dtype": dtype, "shape": shape, "step": chosen, "fastest": fastest,
                    "graph": torch_ms / mine if mine else math.nan,
                    "dispatch": mine / steps[fastest] if mine else math.inf,
                    "eager": torch_call / call_ms, "torch_call_ms": torch_call, "call_ms": call_ms,
                    "torch_ms": torch_ms, "ms": mine})
    return out


def geomean(values) -> float:
    values = [v for v in values if v and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def stats(records: list[dict]) -> dict:
    graph = [r["graph"] for r in records]
    worst = min(records, key=lambda r: r["graph"] if math.isfinite(r["graph"]) else -1)
    slow = [r for r in records if r["torch_call_ms"] >= EAGER_FLOOR_MS]
    worst_eager = min(slow, key=lambda r: r["eager"]) if slow else None
    return {"cases": len(records), "graph_geomean": geomean(graph),
            "graph_held": sum(g >= GOOD for g in graph) / len(graph), "worst": worst,
            "eager_geomean": geomean(r["eager"] for r in records),
            "eager_slow_geomean": geomean(r["eager"] for r in slow), "eager_slow_cases": len(slow),
            "worst_eager": worst_eager,
            "dispatch_within": sum(r["dispatch"] <= DISPATCH_SLACK for r in records),
            "dispatch_worst": max(records, key=lambda r: r["dispatch"])}


def _case(r: dict) -> str:
    return f"{r['dtype']} {r['shape']}"


def summary_table(rows: list[dict], table=None) -> str:
    lines = ["| op | backend | cases | kernel vs torch, geomean | cases >= 0.9x | worst case | "
             "eager call vs torch, geomean (where torch's call >= 20 us) | worst eager there | "
             "step=None within 3% of the fastest |", "|---|---|--:|--:|--:|---|--:|---|--:|"]
    for op in SPECS:
        for backend in rosetta.BACKENDS:
            records = per_case(rows, op, backend)
            if not records:
                continue
            s = stats(records)
            w, we, wd = s["worst"], s["worst_eager"], s["dispatch_worst"]
            lines.append(
                f"| {op} | {backend} | {s['cases']} | {s['graph_geomean']:.2f}x | {s['graph_held']:.0%} | "
                f"{w['graph']:.2f}x ({_case(w)}, step {w['step']}) | {s['eager_geomean']:.2f}x "
                f"({s['eager_slow_geomean']:.2f}x over {s['eager_slow_cases']}) | "
                + (f"{we['eager']:.2f}x ({_case(we)})" if we else "-")
                + f" | {s['dispatch_within']}/{s['cases']} (worst {wd['dispatch']:.2f}x: {_case(wd)}, "
                  f"step {wd['step']} vs {wd['fastest']}) |")
    source = f" Dispatch table: run {table.git_sha} on {table.gpu}." if table else ""
    return ("Ratios are torch's time over ours (> 1: faster than torch). Kernel: CUDA-graph replays, L2 "
            "flushed; eager: the public call in a loop, as a user makes it." + source + "\n\n" + "\n".join(lines))


def case_table(rows: list[dict], op: str) -> str:
    lines = ["| dtype | shape | torch (us) | " + " | ".join(
        f"{b} step=None | {b} kernel (us) | vs torch | fastest step | {b} call (us) | torch call (us) | call vs torch"
        for b in rosetta.BACKENDS) + " |",
        "|---|---|--:|" + "--:|--:|--:|--:|--:|--:|--:|" * len(rosetta.BACKENDS)]
    by_case = {b: {(r["dtype"], r["shape"]): r for r in per_case(rows, op, b)} for b in rosetta.BACKENDS}
    keys = sorted({k for b in by_case.values() for k in b}, key=lambda k: (k[0], shape_of(k[1])))
    for key in keys:
        cells, torch_us = [], ""
        for b in rosetta.BACKENDS:
            r = by_case[b].get(key)
            if not r:
                cells.append("- | - | - | - | - | - | -")
                continue
            torch_us = f"{r['torch_ms'] * 1e3:.1f}"
            cells.append(f"{r['step']} | {r['ms'] * 1e3:.1f} | {r['graph']:.2f}x | {r['fastest']} | "
                         f"{r['call_ms'] * 1e3:.1f} | {r['torch_call_ms'] * 1e3:.1f} | {r['eager']:.2f}x")
        lines.append(f"| {key[0]} | {key[1]} | {torch_us} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def heatmap(rows: list[dict], op: str, path: Path) -> Path | None:
    """The dispatched step's kernel time against torch's over the suite's two axes, one panel per
    backend: green faster than torch, red slower, the number in each cell."""
    suite = SPECS[op].suite
    panels = [(b, per_case(rows, op, b)) for b in rosetta.BACKENDS]
    panels = [(b, recs) for b, recs in panels if recs]
    if not suite or not panels:
        return None
    dtypes = {str(d).removeprefix("torch."): d for _, d in suite.cases}
    label = {(str(d).removeprefix("torch."), "x".join(map(str, s))): (suite.rows[1](s, d), suite.cols[1](s, d))
             for s, d in suite.cases}
    row_labels = list(dict.fromkeys(label[k][0] for k in label))
    col_labels = list(dict.fromkeys(label[k][1] for k in label))
    fig, axes = plt.subplots(1, len(panels), figsize=(1.0 + 0.75 * len(col_labels) * len(panels),
                                                      1.5 + 0.32 * len(row_labels)), squeeze=False)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-1.5, vmax=1.5)  # log2 of the ratio: 0.35x ... 2.8x
    for ax, (backend, records) in zip(axes[0], panels):
        grid = np.full((len(row_labels), len(col_labels)), np.nan)
        for r in records:
            if (r["dtype"], r["shape"]) in label and dtypes:
                y, x = label[r["dtype"], r["shape"]]
                grid[row_labels.index(y), col_labels.index(x)] = r["graph"]
        ax.imshow(np.log2(grid), cmap="RdYlGn", norm=norm, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if math.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
        ax.set_xlabel(suite.cols[0])
        ax.set_ylabel(suite.rows[0])
        s = stats(records)
        ax.set_title(f"{op}, {backend} step=None vs torch (kernel time)\ngeomean {s['graph_geomean']:.2f}x, "
                     f"{s['graph_held']:.0%} of cases >= {GOOD}x", fontsize=9)
    return save(fig, path)


def write(out_dir: Path, rows: list[dict]) -> Path:
    parts = ["# Shape suite", "", "Generated by `python -m rosetta.bench --suite` from suite.csv; "
             "the cases are each op spec's `suite`.", "", summary_table(rows)]
    for op in SPECS:
        plot = heatmap(rows, op, out_dir / "plots" / f"suite_{op}.png")
        if plot is None:
            continue
        parts += ["", f"## {op}", "", f"![{op} suite heatmap](plots/{plot.name})", "", case_table(rows, op)]
    path = out_dir / "suite.md"
    path.write_text("\n".join(parts) + "\n")
    return path
