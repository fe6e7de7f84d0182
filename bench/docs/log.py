"""KERNEL_LOG.md: per op a generated summary, then per step (teaching order) a generated block
(header, measured numbers with deltas, ncu metrics with deltas) followed by the hand-written
**Prediction** and **Lesson**. Steps without a section get one appended with placeholders;
hand-written text is never touched, and regenerating from the same data changes nothing."""
from __future__ import annotations

import os
from pathlib import Path

import re

import rosetta
from rosetta.registry import REPO

from .. import results
from ..profiling import ncu
from . import markers, prose, tables

LOG = REPO / "KERNEL_LOG.md"
PLACEHOLDER = "_not written yet_"


def step_block(v, rows, ncu_rows, run_sha: str | None = None) -> str:
    """`run_sha`: set when the step's source changed after that bench run (the rows are older)."""
    h = v.header
    dtypes = ", ".join(str(d).removeprefix("torch.") for d in v.dtypes)
    text = [f"- **Changed:** {h.changed}", f"- **Why:** {h.why}", f"- **Still:** {h.still}",
            f"- **Limits:** {h.limits}", f"- **Takes:** {dtypes}; layout `{v.layout}`"
            + "".join(f"; {q} <= {m:,}" for q, m in v.bounds) + "".join(f"; {q} >= {m:,}" for q, m in v.minimums)]
    if h.roofline:
        text.append(f"- **Roofline:** {h.roofline}")
    if h.mirrors:
        text.append(f"- **Mirrors:** {h.mirrors}")
    if v.hazard:
        text.append(f"- **Hazard:** {v.hazard}")
    if v.slower:
        text.append(f"- **Slower:** {v.slower}")
    text.append(f"- **Source:** [`{v.source}`]({v.source})")
    if run_sha:
        text.append(f"- **Changed since the run:** the source (or a shared file it uses) differs "
                    f"from run {run_sha}'s; the numbers below measured that earlier code")
    text.append("")
    order = {key[:3]: i for i, key in enumerate(tables.headlines(v.op))}
    mine = sorted((r for r in rows if r["label"] == v.label and r["role"] == "headline"),
                  key=lambda r: order.get((r["direction"], r["shape"], r["dtype"]), len(order)))
    if mine:
        metric = mine[0]["metric"]
        text += [f"| direction | dtype | shape | time (us) | {metric} | % of ceiling | vs torch | Δ vs step {v.step - 1} |",
                 "|---|---|---|--:|--:|--:|--:|--:|"]
        for r in mine:
            where = f"| {r['direction']} | {r['dtype']} | {r['shape']} "
            if r["status"] != "ok":
                text.append(where + f"| {r['status']} | | | | |")
                continue
            prev = _previous(v, rows, r)
            delta = f"{r['throughput'] / prev['throughput'] - 1:+.1%}" if prev and prev.get("throughput") else ""
            pct = f"{r['pct_of_ceiling']:.1f}" if r["pct_of_ceiling"] is not None else ""
            vs = f"{r['speedup_vs_torch']:.3f}x" if r["speedup_vs_torch"] is not None else ""
            text.append(where + f"| {r['p50_ms'] * 1e3:.1f} | {r['throughput']:.{1 if metric == 'TFLOP/s' else 0}f} "
                                f"| {pct} | {vs} | {delta} |")
    else:
        text.append("_not measured yet_")
    metrics = ncu.step_table(ncu_rows, v)
    if metrics:
        text += ["", metrics]
    return "\n".join(text)


def _previous(v, rows, row):
    if v.step == 1:
        return None
    label = rosetta.variants(v.op, v.backend)[v.step - 2].label
    return next((r for r in rows if r["label"] == label and r["direction"] == row["direction"]
                 and r["dtype"] == row["dtype"] and r["shape"] == row["shape"]), None)


def op_block(op, rows, ncu_rows, folder) -> str:
    rel = Path(os.path.relpath(folder, REPO))
    parts = [tables.op_tables(rows, op, folder, level="####"), "", "Lines of code (lizard NLOC):", "",
             tables.lines_table(op)]
    if ncu_rows and (folder / "plots" / f"{op}_ncu.png").exists():
        parts.append(f"![{op} ncu]({rel}/plots/{op}_ncu.png)")
    return "\n".join(parts)


def skeleton_step(v) -> str:
    return (f"### {v.label} — {v.header.title}\n\n{markers.block(v.label, '')}\n\n"
            f"**Prediction.** {PLACEHOLDER}\n\n**Lesson.** {PLACEHOLDER}\n")


def ensure_sections(text: str) -> str:
    """Append a section for every op and step that has none yet (placeholders for the prose)."""
    present = set(markers.names(text))
    for op in rosetta.ops_with_steps():
        ladder = rosetta.variants(op)
        if f"{op}/summary" not in present:
            text = text.rstrip() + f"\n\n## {op}\n\n{markers.block(f'{op}/summary', '')}\n"
        for v in ladder:
            if v.label not in present:
                text = _insert_in_op(text, op, skeleton_step(v))
    return text


def _op_span(text: str, op: str) -> tuple[int, int]:
    start = text.index(f"\n## {op}\n")
    end = text.find("\n## ", start + 1)
    return start, len(text) if end == -1 else end


def order_steps(text: str, op: str) -> str:
    """Put the op's step sections in registry order, each carrying its hand-written prose along
    (a step added later, e.g. CUDA step 4 after the Triton steps existed, moves into place)."""
    start, end = _op_span(text, op)
    head, *chunks = re.split(r"(?m)^(?=### )", text[start:end])
    by_label = {chunk.split()[1]: chunk.strip() for chunk in chunks}
    ordered = [by_label.pop(v.label) for v in rosetta.variants(op) if v.label in by_label]
    ordered += by_label.values()  # sections of removed steps stay, at the end, for a human to cut
    body = head.rstrip() + "\n\n" + "\n\n".join(ordered) + "\n"
    return text[:start] + body + ("\n" + text[end:].lstrip("\n") if end < len(text) else "")


def _insert_in_op(text: str, op: str, section: str) -> str:
    """Insert at the end of the op's section (before the next `## ` heading, or at the end)."""
    _, end = _op_span(text, op)
    return text[:end].rstrip() + "\n\n" + section + text[end:]


def update(folder, figures=None) -> bool:
    """`figures`: the folder's prose.Data, when the caller has it already."""
    rows = results.read_rows(folder / "bench.csv")
    ncu_rows = ncu.read_table(folder / "ncu.csv")
    original = LOG.read_text() if LOG.exists() else "# KERNEL_LOG\n"
    text = ensure_sections(original)
    changed = {v.label: run for v, run in results.changed_since_run(folder, rosetta.variants()).items()}
    for op in rosetta.ops_with_steps():
        text = order_steps(text, op)
        text = markers.replace(text, f"{op}/summary", op_block(op, rows, ncu_rows, folder))
        for v in rosetta.variants(op):
            text = markers.replace(text, v.label, step_block(v, rows, ncu_rows, changed.get(v.label)))
    text = prose.render(text, figures or prose.Data.load(folder))
    if text != original:
        LOG.write_text(text)
    return text != original
