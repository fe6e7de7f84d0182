"""What the static site shows, as plain data: the Mirrors lines parsed into CUDA step numbers, the
two ladders of an op aligned row by row, the translation table, and the measured rows of a step.
Everything comes from the registry, the step files and the committed results (no GPU)."""
from __future__ import annotations

import itertools
import re

import rosetta
from rosetta.registry import REPO

from .. import lines
from ..tier_names import REFERENCE_BACKENDS
from . import tables

_PARENS = re.compile(r"\([^()]*\)")
_LIST = re.compile(r"CUDA steps?\s+((?:\d+(?:\s*-\s*\d+)?)(?:\s*(?:,|and|&)\s*\d+(?:\s*-\s*\d+)?)*)")
_RANGE = re.compile(r"(\d+)(?:\s*-\s*(\d+))?")


def mirror_ranges(text: str) -> list[list[int]]:
    """`CUDA steps 03-08 (fp32) and 09-11 (16-bit)` -> [[3..8], [9, 10, 11]]: each range or single
    number named after "CUDA step(s)", in the order written. Parentheses are commentary (they hold
    numbers like "1 read + 1 write" or "16-bit") and are dropped first."""
    while _PARENS.search(text):
        text = _PARENS.sub("", text)
    found = []
    for listed in _LIST.findall(text):
        for lo, hi in _RANGE.findall(listed):
            found.append(list(range(int(lo), int(hi or lo) + 1)))
    return found


def mirrored(v) -> list[int]:
    """Every CUDA step number a Triton step's Mirrors line names, sorted, without repeats."""
    return sorted({n for r in mirror_ranges(v.header.mirrors) for n in r})


def align(op: str) -> list[tuple]:
    """Rows of (cuda Variant | None, triton Variant | None), both ladders kept in step order.

    A Triton step sits beside the last CUDA step of the first range it mirrors (the point of the CUDA
    ladder it reaches), or of a later range when that one is already passed; a step that mirrors
    nothing ahead of its predecessor's row gets a row of its own after it. An op whose Triton steps
    declare no Mirrors at all is shown side by side by position (the page says so)."""
    cuda, triton = rosetta.variants(op, "cuda"), rosetta.variants(op, "triton")
    if not any(t.header.mirrors for t in triton):  # nothing declared: side by side by position
        return list(itertools.zip_longest(cuda, triton))
    anchors, last = {}, 0
    by_number = {v.step: v for v in cuda}
    for t in triton:
        target = next((r[-1] for r in mirror_ranges(t.header.mirrors)
                       if r[-1] > last and r[-1] in by_number), None)
        if target is None:
            anchors.setdefault(("after", last), []).append(t)
        else:
            anchors[("at", target)] = [t]
            last = target
    rows = [(None, t) for t in anchors.get(("after", 0), [])]
    for c in cuda:
        rows.append((c, anchors.get(("at", c.step), [None])[0]))
        rows += [(None, t) for t in anchors.get(("after", c.step), [])]
    return rows


def nloc(v) -> lines.LineCount:
    return lines.count(REPO / v.source)


def ok_rows(rows: list[dict], label: str) -> list[dict]:
    return [r for r in rows if r["label"] == label and r["role"] == "headline" and r["status"] == "ok"
            and r["throughput"] is not None]


def step_rows(rows: list[dict], v) -> list[dict]:
    """Every headline row measured for a step, in the op's headline order."""
    order = {(d, s, t): i for i, (d, s, t, _) in enumerate(tables.headlines(v.op))}
    mine = [r for r in rows if r["label"] == v.label and r["role"] == "headline"]
    return sorted(mine, key=lambda r: order.get((r["direction"], r["shape"], r["dtype"]), len(order)))


def first_headlines(op: str) -> list[tuple[str, str, str]]:
    """(direction, shape, dtype) of the op's first headline in each direction and dtype: every
    dtype shows (matmul's tensor-core results beside its fp32 ones)."""
    seen = {}
    for direction, shape, dtype, _ in tables.headlines(op):
        seen.setdefault((direction, dtype), (direction, shape, dtype))
    return list(seen.values())


def at(rows: list[dict], case: tuple, label: str) -> dict | None:
    direction, shape, dtype = case
    return next((r for r in ok_rows(rows, label)
                 if (r["direction"], r["shape"], r["dtype"]) == (direction, shape, dtype)), None)


def best_at(rows: list[dict], case: tuple, variants) -> tuple:
    """(Variant, row) of the highest throughput among `variants` at one headline, or (None, None)."""
    found = [(v, r) for v in variants if (r := at(rows, case, v.label))]
    return max(found, key=lambda vr: vr[1]["throughput"]) if found else (None, None)


def torch_row(rows: list[dict], op: str, case: tuple) -> dict | None:
    return at(rows, case, f"{op}/torch/eager")


def translation(rows: list[dict], op: str) -> list[dict]:
    """One entry per Triton step with a Mirrors line: the CUDA steps it absorbs, their summed device
    NLOC against its own, and the best throughput of each side at the first headline (in headline
    order) where both sides were measured."""
    cuda = {v.step: v for v in rosetta.variants(op, "cuda")}
    out = []
    for t in rosetta.variants(op, "triton"):
        absorbed = [cuda[n] for n in mirrored(t) if n in cuda]
        if not absorbed:
            continue
        case = cuda_best = t_row = None
        for direction, shape, dtype, _ in tables.headlines(op):
            c = (direction, shape, dtype)
            t_row, (cv, cr) = at(rows, c, t.label), best_at(rows, c, absorbed)
            if t_row and cr:
                case, cuda_best = c, (cv, cr)
                break
        out.append({"triton": t, "cuda": absorbed, "cuda_nloc": sum(nloc(v).device_nloc for v in absorbed),
                    "triton_nloc": nloc(t).device_nloc, "case": case,
                    "cuda_best": cuda_best, "triton_row": t_row if case else None})
    return out


def reference_labels(rows: list[dict], op: str) -> list[str]:
    """Labels of the reference tiers (torch eager/compile, libraries) measured for an op."""
    seen = []
    for r in rows:
        if r["op"] == op and r["backend"] in REFERENCE_BACKENDS and r["label"] not in seen:
            seen.append(r["label"])
    return seen
