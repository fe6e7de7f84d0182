"""Markdown tables from results rows, in teaching order (never sorted by speed)."""
from __future__ import annotations

import os
from pathlib import Path

from rosetta.ops import SPECS

from ..results import DEFAULT_LAYOUT, order_key
from ..tier_names import REFERENCE_BACKENDS


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def shape_name(shape: tuple) -> str:
    return "x".join(map(str, shape))


def headlines(op: str) -> list[tuple[str, str, str, str]]:
    """(direction, shape, dtype, note) of every ladder table of an op, in spec order."""
    spec = SPECS[op]
    return [(direction, shape_name(h.shape), str(d).removeprefix("torch."), h.note)
            for direction in spec.directions() for h in spec.headlines for d in h.dtypes]


def headline_rows(rows: list[dict], op: str, direction: str, shape: str, dtype: str) -> list[dict]:
    return sorted((r for r in rows if r["op"] == op and r["role"] == "headline" and r["direction"] == direction
                   and r["shape"] == shape and r["dtype"] == dtype), key=order_key)


def title(op: str, direction: str, shape: str, dtype: str, note: str = "") -> str:
    both = len(SPECS[op].directions()) > 1
    return f"{op}{' ' + direction if both else ''}, {dtype}, {shape}" + (f" ({note})" if note else "")


def ladder_table(rows: list[dict], op: str, direction: str, shape: str, dtype: str) -> str:
    """One line per tier/step at one headline: time, throughput, % of the measured ceiling and of
    the theoretical peak, speedup vs torch eager, and the change from the previous step."""
    chosen = headline_rows(rows, op, direction, shape, dtype)
    if not chosen:
        return f"_no {title(op, direction, shape, dtype)} results yet_\n"
    metric = chosen[0]["metric"]
    out = [f"| step | time (us) | {metric} | % of measured ceiling | % of theoretical peak | vs torch | "
           "Δ vs prev. step | error / tol. |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    tolerance = SPECS[op].directions()[direction].tolerance
    tol = next((t for d, t in tolerance.items() if str(d).removeprefix("torch.") == dtype), None)
    previous = {}
    for r in chosen:
        name = r["label"].split("/", 1)[1]
        err = "" if r.get("error") is None else (
            f"{r['error'] / tol:.2f}" if tol else f"{r['error']:.1e}")
        if r["status"] != "ok":
            out.append(f"| {name} | {r['status']} | | | | | | {err} |")
            continue
        prev = previous.get(r["backend"])
        delta = f"{r['throughput'] / prev - 1:+.1%}" if prev and r["backend"] not in REFERENCE_BACKENDS else ""
        previous[r["backend"]] = r["throughput"]
        copy = f" (copied {r['input_copy']})" if r.get("input_copy") else ""
        out.append(f"| {name}{copy} | {r['p50_ms'] * 1e3:.1f} | {r['throughput']:.{1 if metric == 'TFLOP/s' else 0}f} | "
                   f"{_num(r['pct_of_ceiling'], '.1f')} | {_num(r.get('pct_of_theoretical'), '.1f')} | "
                   f"{_num(r['speedup_vs_torch'], '.3f')}{'x' if r['speedup_vs_torch'] else ''} | {delta} | {err} |")
    return "\n".join(out) + "\n"


def all_ladder_tables(rows: list[dict], op: str, level: str = "####") -> str:
    """Every headline table of an op that has rows, each under its title."""
    parts = []
    for direction, shape, dtype, note in headlines(op):
        if headline_rows(rows, op, direction, shape, dtype):
            parts += [f"{level} {title(op, direction, shape, dtype, note)}", "",
                      ladder_table(rows, op, direction, shape, dtype)]
    return "\n".join(parts)


def layout_table(rows: list[dict], op: str) -> str:
    """The best step of each backend and the library on the spec's other input layouts: time per
    layout and its ratio to the same subject's time on the default layout, the two measured in
    turns (a ratio near 1.00 means the layout costs nothing; an input the step copies says so)."""
    spec = SPECS[op]
    names = list(spec.input_layouts)
    mine = [r for r in rows if r["op"] == op and r["role"] == "layout"]
    if not mine:
        return ""
    out = ["| step | dtype | shape | default (us) | " + " | ".join(f"{n} (us, vs default)" for n in names) + " |",
           "|---|---|---|--:|" + "--:|" * len(names)]
    for h in spec.layout_headlines:
        for d in h.dtypes:
            dtype, shape = str(d).removeprefix("torch."), shape_name(h.shape)
            here = sorted((r for r in mine if r["dtype"] == dtype and r["shape"] == shape), key=order_key)
            for label in dict.fromkeys(r["label"] for r in here):
                base = next((r for r in here if r["label"] == label and r["layout"] == DEFAULT_LAYOUT), None)
                base_ms = base["p50_ms"] if base and base["status"] == "ok" else None
                cells = []
                for n in names:
                    r = next((r for r in here if r["label"] == label and r["layout"] == n), None)
                    if r is None or r["status"] != "ok":
                        cells.append(r["status"] if r else "")
                        continue
                    ratio = f", {r['p50_ms'] / base_ms:.2f}x" if base_ms else ""
                    copy = f", copied {r['input_copy']}" if r.get("input_copy") else ""
                    cells.append(f"{r['p50_ms'] * 1e3:.1f}{ratio}{copy}")
                default = f"{base_ms * 1e3:.1f}" if base_ms else ""
                out.append(f"| {label.split('/', 1)[1]} | {dtype} | {shape} | {default} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def lines_table(op: str) -> str:
    """Device and host NLOC per step (counted from the sources now) and the Triton-vs-CUDA totals."""
    import rosetta

    from .. import lines

    out = ["| step | device NLOC | device tokens | host NLOC |", "|---|--:|--:|--:|"]
    totals = {}
    for v in rosetta.variants(op):
        c = lines.count(rosetta.registry.REPO / v.source)
        out.append(f"| {v.label.split('/', 1)[1]} | {c.device_nloc} | {c.device_tokens} | {c.host_nloc} |")
        t = totals.setdefault(v.backend, [0, 0, 0, 0])
        t[0], t[1], t[2], t[3] = t[0] + 1, t[1] + c.device_nloc, t[2] + c.device_tokens, t[3] + c.host_nloc
    for backend, (steps, nloc, tokens, host) in totals.items():
        out.append(f"| **{backend} total ({steps} steps)** | {nloc} | {tokens} | {host} |")
    if {"cuda", "triton"} <= set(totals):
        ratio = totals["triton"][1] / totals["triton"][0] / (totals["cuda"][1] / totals["cuda"][0])
        out.append(f"\nTriton vs CUDA: {ratio:.2f}x the device lines per step.")
    return "\n".join(out) + "\n"


def plot_name(op: str, direction: str, shape: str = "", dtype: str = "", kind: str = "ladder") -> str:
    parts = [op] + ([direction] if len(SPECS[op].directions()) > 1 else []) + [p for p in (dtype, shape) if p]
    return "_".join(parts + [kind]) + ".png"


def op_tables(rows, op, folder, level="####", base=None) -> str:
    """Every ladder table of an op, each followed by its plot, then the sweep plots; links relative
    to `base` (the folder of the file they go in; the repository's root by default)."""
    from rosetta.registry import REPO

    rel = Path(os.path.relpath(folder, base or REPO))
    parts = []
    for direction, shape, dtype, note in headlines(op):
        if headline_rows(rows, op, direction, shape, dtype):
            parts += [f"{level} {title(op, direction, shape, dtype, note)}", "",
                      ladder_table(rows, op, direction, shape, dtype),
                      f"![{op} {direction} {dtype} {shape}]({rel}/plots/{plot_name(op, direction, shape, dtype)})", ""]
    layouts = layout_table(rows, op)
    if layouts:
        parts += [f"{level} {op}: other input layouts (forward, best step of each backend)", "",
                  "Each input holds the same values as in the ladder tables, stored another way: `a.t()` "
                  "is a column-major A, as a transposed view of a row-major (K, M) tensor is.", "", layouts]
    for direction in SPECS[op].directions():
        sweep = folder / "plots" / plot_name(op, direction, kind="sweep")
        if sweep.exists():
            parts.append(f"![{op} {direction} sweep]({rel}/plots/{sweep.name})")
    return "\n".join(parts)


def best_table(rows: list[dict], op: str) -> str:
    """One line per headline: torch eager, the best other library tier (torch.compile, CUB, Liger)
    and the best step of each backend, each with its throughput and its ratio to torch eager."""
    lines = []
    for direction, shape, dtype, _ in headlines(op):
        chosen = [r for r in headline_rows(rows, op, direction, shape, dtype) if r["status"] == "ok"]
        eager = next((r for r in chosen if r["backend"] == "torch" and r["name"] == "eager"), None)
        if not chosen or eager is None:
            continue
        metric = eager["metric"]
        digits = 1 if metric == "TFLOP/s" else 0

        def cell(candidates, named=lambda r: r["label"].split("/", 1)[1]):
            if not candidates:
                return "-"
            top = max(candidates, key=lambda r: r["throughput"])
            return f"{top['throughput']:,.{digits}f} ({named(top)}, {top['throughput'] / eager['throughput']:.2f}x)"
        library = [r for r in chosen if r["backend"] in REFERENCE_BACKENDS and r is not eager
                   and r["backend"] != "ablation" and r["name"] != "unfused"]
        steps = {b: [r for r in chosen if r["backend"] == b] for b in ("cuda", "triton")}
        both = len(SPECS[op].directions()) > 1
        lines.append(f"| {direction + ' ' if both else ''}{dtype} {shape} | {eager['throughput']:,.{digits}f} | "
                     f"{cell(library)} | {cell(steps['cuda'], lambda r: 'step ' + str(r['step']))} | "
                     f"{cell(steps['triton'], lambda r: 'step ' + str(r['step']))} |")
    if not lines:
        return f"_no {op} results yet_"
    metric = next(r["metric"] for r in rows if r["op"] == op)
    return "\n".join([f"| {op} ({metric}) | torch | best library tier | best CUDA step | best Triton step |",
                      "|---|--:|--:|--:|--:|", *lines])
