"""Markdown tables from results rows, in teaching order (never sorted by speed)."""
from __future__ import annotations

from .results import order_key
from .tiers import REFERENCE_BACKENDS


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def headline_rows(rows: list[dict], op: str, dtype: str) -> list[dict]:
    return sorted((r for r in rows if r["op"] == op and r["role"] == "headline" and r["dtype"] == dtype),
                  key=order_key)


def ladder_table(rows: list[dict], op: str, dtype: str) -> str:
    """One line per tier/step at the op's headline shape: time, throughput, % of ceiling,
    speedup vs torch eager, and the change from the previous step of the same backend."""
    chosen = headline_rows(rows, op, dtype)
    if not chosen:
        return f"_no {op} {dtype} results yet_\n"
    metric = chosen[0]["metric"]
    out = [f"| step | time (us) | {metric} | % of ceiling | vs torch | Δ vs prev. step | rel. error |",
           "|---|--:|--:|--:|--:|--:|--:|"]
    previous = {}
    for r in chosen:
        name = r["label"].split("/", 1)[1]
        if r["status"] != "ok":
            out.append(f"| {name} | {r['status']} | | | | | {_num(r.get('rel_error'), '.1e')} |")
            continue
        prev = previous.get(r["backend"])
        delta = f"{r['throughput'] / prev - 1:+.1%}" if prev and r["backend"] not in REFERENCE_BACKENDS else ""
        previous[r["backend"]] = r["throughput"]
        out.append(f"| {name} | {r['p50_ms'] * 1e3:.1f} | {r['throughput']:.0f} | "
                   f"{_num(r['pct_of_ceiling'], '.1f')} | {_num(r['speedup_vs_torch'], '.3f')}{'x' if r['speedup_vs_torch'] else ''} | "
                   f"{delta} | {_num(r.get('rel_error'), '.1e')} |")
    return "\n".join(out) + "\n"


def lines_table(op: str) -> str:
    """Device and host NLOC per step (counted from the sources now) and the Triton-vs-CUDA totals."""
    import rosetta

    from . import lines

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
