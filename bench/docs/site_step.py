"""One step's card on an op page: header, dtypes/layout, line counts, measured rows, ncu metrics,
the highlighted source and the diff against the previous step of its ladder."""
from __future__ import annotations

import difflib
from html import escape

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import CudaLexer, DiffLexer, PythonLexer

import rosetta
from rosetta.registry import REPO

from ..profiling import ncu
from . import site_data

FORMATTER = HtmlFormatter(cssclass="highlight")
LEXERS = {"cuda": CudaLexer, "triton": PythonLexer}


def anchor(v) -> str:
    return f"{v.backend}-{v.step:02d}"


def step_name(v) -> str:
    return f"{'CUDA' if v.backend == 'cuda' else 'Triton'} {v.step:02d}"


def link(v, page: str = "") -> str:
    return f'<a href="{page}#{anchor(v)}">{escape(step_name(v))} {escape(v.name)}</a>'


def dtype_names(v) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in v.dtypes)


def fmt(value, spec: str, suffix: str = "") -> str:
    return "" if value is None else format(value, spec) + suffix


def throughput(row: dict) -> str:
    if not row or row.get("throughput") is None:
        return ""
    return f"{row['throughput']:.{1 if row['metric'] == 'TFLOP/s' else 0}f} {row['metric']}"


def header_html(v) -> str:
    h = v.header
    fields = [("Changed", h.changed), ("Why", h.why), ("Still", h.still), ("Limits", h.limits)]
    if h.mirrors:
        fields.append(("Mirrors", h.mirrors))
    if v.hazard:
        fields.append(("Hazard", v.hazard))
    if v.slower:
        fields.append(("Slower", v.slower))
    items = "".join(f"<dt>{k}</dt><dd>{escape(t)}</dd>" for k, t in fields)
    return f'<dl class="header">{items}</dl>'


def measured_html(rows: list[dict], v) -> str:
    mine = site_data.step_rows(rows, v)
    if not mine:
        return '<p class="none">not measured in the committed results</p>'
    out = ["<div class=\"wide\"><table class=\"measured\"><tr><th>direction</th><th>dtype</th><th>shape</th><th>time (us)</th>"
           "<th>throughput</th><th>% of measured ceiling</th><th>vs torch</th></tr>"]
    for r in mine:
        cells = [r["direction"], r["dtype"], r["shape"]]
        if r["status"] != "ok":
            cells += [r["status"], "", "", ""]
        else:
            cells += [fmt(r["p50_ms"] and r["p50_ms"] * 1e3, ".1f"), throughput(r),
                      fmt(r["pct_of_ceiling"], ".1f"), fmt(r["speedup_vs_torch"], ".3f", "x")]
        out.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    return "".join(out) + "</table></div>"  # scrolls inside its half of the page, never widens it


def ncu_html(ncu_rows: list[dict], v) -> str:
    mine = [r for r in ncu_rows if r["label"] == v.label]
    if not mine:
        return ""
    cols = [c for c in ncu.SHORT if any(r.get(c[1]) is not None for r in mine)]
    out = ['<div class="wide"><table class="ncu"><tr><th>ncu</th><th>kernels</th>'
           + "".join(f"<th>{escape(c[0])}</th>" for c in cols) + "</tr>"]
    for r in mine:
        case = " ".join(p for p in (r["direction"], r.get("dtype"), r.get("shape")) if p)
        cells = [case, r["kernels"]] + ["" if r.get(m) is None else f(r[m]) for _, m, f in cols]
        out.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    return "".join(out) + "</table></div>"


def source_text(v) -> str:
    return (REPO / v.source).read_text()


def source_html(v) -> str:
    text = source_text(v)
    return (f'<details class="source"><summary>source: <code>{escape(v.source)}</code> '
            f'({len(text.splitlines())} lines)</summary>{highlight(text, LEXERS[v.backend](), FORMATTER)}</details>')


def diff_html(v) -> str:
    """The unified diff against the previous step of the same ladder (none for step 1)."""
    if v.step == 1:
        return ""
    prev = rosetta.variants(v.op, v.backend)[v.step - 2]
    diff = list(difflib.unified_diff(source_text(prev).splitlines(keepends=True),
                                     source_text(v).splitlines(keepends=True),
                                     fromfile=prev.source, tofile=v.source))
    added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
    removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
    body = highlight("".join(diff), DiffLexer(), FORMATTER) if diff else "<p>identical</p>"
    return (f'<details class="diff"><summary>diff vs {escape(step_name(prev))} {escape(prev.name)} '
            f'(+{added} −{removed})</summary>{body}</details>')


def card(v, rows: list[dict], ncu_rows: list[dict]) -> str:
    c = site_data.nloc(v)
    meta = (f"dtypes: {escape(dtype_names(v))} · layout: {escape(v.layout)} · device NLOC {c.device_nloc} "
            f"({c.device_tokens} tokens) · host NLOC {c.host_nloc}")
    return (f'<section class="step {v.backend}" id="{anchor(v)}">'
            f'<h3><span class="num">{escape(step_name(v))}</span> {escape(v.header.title)}</h3>'
            f'{header_html(v)}<p class="meta">{meta}</p>{measured_html(rows, v)}{ncu_html(ncu_rows, v)}'
            f'{source_html(v)}{diff_html(v)}</section>')
