"""A static site from the registry, the step files and the committed results (no GPU, no network):
`make site` runs `python -m rosetta.bench.docs.site [--out site]`.

    site/index.html     one row per op and direction: the best step of each backend at the op's first
                        headline, its ratio to torch eager, its device NLOC
    site/<op>.html      the CUDA and Triton ladders side by side, aligned by the step each Triton step
                        mirrors; per step its header, source, diff, line counts, measured rows, ncu
    site/claims.html    claims common in Triton teaching material against our numbers, with verdicts
    site/plots/*.png    the plots of the reference results, copied
"""
from __future__ import annotations

import argparse
import shutil
import sys
from html import escape
from pathlib import Path

import rosetta
from rosetta.ops import SPECS

from .. import results
from ..profiling import ncu
from . import site_claims, site_data, site_step
from .report import reference_results
from .site_step import fmt, link, throughput

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; max-width: 1800px; }
h1, h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; vertical-align: top; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
table.ladder { width: 100%; table-layout: fixed; } table.ladder > tbody > tr > td { text-align: left; width: 50%; }
table.ladder > tbody > tr > td.alone { width: 100%; }
.step h3 { margin: .2em 0; } .step .num { background: #333; color: #fff; padding: 0 .4em; border-radius: 3px; }
.step.triton .num { background: #2a6f97; } .step.cuda .num { background: #5a8f29; }
dl.header { display: grid; grid-template-columns: max-content 1fr; gap: 2px 10px; margin: .4em 0; }
dl.header dt { font-weight: bold; } dl.header dd { margin: 0; }
.meta { color: #555; } .none { color: #999; font-style: italic; }
.wide { overflow-x: auto; max-width: 100%; } .highlight { overflow-x: auto; font-size: 12px; max-height: 40em; overflow-y: auto; }
details { margin: .4em 0; } summary { cursor: pointer; color: #2a6f97; }
img.plot { max-width: 48%; border: 1px solid #eee; margin: 2px; }
.verdict { display: inline-block; font-weight: bold; padding: 1px 8px; border-radius: 3px; color: #fff; }
.verdict.holds { background: #5a8f29; } .verdict.fails { background: #b23b3b; }
.verdict.depends { background: #c07a12; } .verdict.unmeasured { background: #888; }
td.rows { text-align: left; font-size: 12px; }
"""


def page(title: str, body: str) -> str:
    styles = CSS + site_step.FORMATTER.get_style_defs(".highlight")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{styles}</style></head><body>{body}</body></html>\n")


def nav() -> str:
    ops = " · ".join(f'<a href="{op}.html">{op}</a>' for op in rosetta.ops_with_steps())
    claims = '<a href="claims.html">claims, measured</a>'
    return f'<p class="nav"><a href="index.html">overview</a> · {ops} · {claims}</p>'


def best_cell(rows, case, op, backend, page_name) -> str:
    v, r = site_data.best_at(rows, case, rosetta.variants(op, backend))
    if v is None:
        return "<td>—</td><td></td><td></td><td></td>"
    return (f"<td>{link(v, page_name)}</td><td>{throughput(r)}</td>"
            f"<td>{fmt(r['speedup_vs_torch'], '.3f', 'x')}</td><td>{site_data.nloc(v).device_nloc}</td>")


def index_html(rows: list[dict], env: dict, plots: list[str], suite_rows: list[dict] = ()) -> str:
    head = ("<tr><th>op</th><th>direction</th><th>headline</th><th>torch eager</th>"
            "<th>best CUDA step</th><th>throughput</th><th>vs torch</th><th>device NLOC</th>"
            "<th>best Triton step</th><th>throughput</th><th>vs torch</th><th>device NLOC</th></tr>")
    out = []
    for op in rosetta.ops_with_steps():
        for case in site_data.first_headlines(op):
            direction, shape, dtype = case
            out.append(f'<tr><td><a href="{op}.html">{op}</a></td><td>{direction}</td><td>{dtype} {shape}</td>'
                       f"<td>{throughput(site_data.torch_row(rows, op, case))}</td>"
                       + best_cell(rows, case, op, "cuda", f"{op}.html")
                       + best_cell(rows, case, op, "triton", f"{op}.html") + "</tr>")
    envline = ", ".join(f"{k} {escape(str(env[k]))}" for k in ("gpu", "torch", "triton", "cuda_runtime",
                                                               "driver", "git_sha", "date_utc") if env.get(k))
    roof = "".join(plot_link(p) for p in plots if p == "roofline.png")
    body = (f"<h1>kernel-rosetta</h1>{nav()}<p>CUDA C++ and Triton optimization ladders for "
            f"{', '.join(rosetta.ops_with_steps())}, step by step. Measured: {envline}.</p>"
            f"<p>Best step = highest throughput at the op's first headline shape per direction and dtype; "
            f"vs torch = speedup over torch eager (bench.csv's speedup_vs_torch); device NLOC = "
            f"lizard NLOC of the step's kernel bodies.</p><table>{head}{''.join(out)}</table>"
            f"{suite_html(suite_rows, plots)}<h2>The roofline</h2>{roof}")
    return page("kernel-rosetta", body)


def plot_link(name: str) -> str:
    """A plot's thumbnail, linked to the full-size image."""
    return f'<a href="plots/{name}"><img class="plot" src="plots/{name}" alt="{name}"></a>'


def suite_html(rows: list[dict], plots: list[str]) -> str:
    """The shape suite: step=None's kernel time against torch over the shapes users bring."""
    from . import suite_report

    lines = []
    for op in rosetta.ops_with_steps():
        for backend in rosetta.BACKENDS:
            records = suite_report.per_case(rows, op, backend)
            if not records:
                continue
            s = suite_report.stats(records)
            w = s["worst"]
            lines.append(f"<tr><td>{op}</td><td>{backend}</td><td>{s['cases']}</td>"
                         f"<td>{s['graph_geomean']:.2f}x</td><td>{s['graph_held']:.0%}</td>"
                         f"<td>{w['graph']:.2f}x ({escape(w['dtype'])} {escape(w['shape'])}, step {w['step']})</td>"
                         f"<td>{s['dispatch_within']}/{s['cases']}</td></tr>")
    if not lines:
        return ""
    maps = "".join(plot_link(f"suite_{op}.png") for op in rosetta.ops_with_steps() if f"suite_{op}.png" in plots)
    return ("<h2>Any shape: the shape suite</h2><p>step=None's kernel time against torch's on the shapes users "
            "bring (CUDA-graph replays, L2 flushed; &gt; 1 is faster than torch), and how often step=None ran "
            "within 3% of the fastest step.</p><table><tr><th>op</th><th>backend</th><th>cases</th>"
            "<th>geomean</th><th>cases &ge; 0.9x</th><th>worst case</th><th>step=None within 3%</th></tr>"
            + "".join(lines) + "</table>" + maps)


def translation_html(rows, op) -> str:
    entries = site_data.translation(rows, op)
    if not entries:
        return "<p class=\"none\">no Triton step of this op declares a Mirrors line.</p>"
    out = ["<table><tr><th>Triton step</th><th>absorbs CUDA steps</th><th>CUDA device NLOC (sum)</th>"
           "<th>Triton device NLOC</th><th>at</th><th>best of those CUDA steps</th><th>Triton step</th></tr>"]
    for e in entries:
        cuda = ", ".join(link(v) for v in e["cuda"])
        case = " ".join(e["case"]) if e["case"] else "no headline has both sides measured"
        best = (f"{link(e['cuda_best'][0])}: {throughput(e['cuda_best'][1])}" if e["cuda_best"] else "")
        out.append(f"<tr><td>{link(e['triton'])}</td><td>{cuda}</td><td>{e['cuda_nloc']}</td>"
                   f"<td>{e['triton_nloc']}</td><td>{escape(case)}</td><td>{best}</td>"
                   f"<td>{throughput(e['triton_row'])}</td></tr>")
    return "".join(out) + "</table>"


def summary_html(rows, op) -> str:
    """Per headline: the reference tiers and the best step of each backend."""
    refs = site_data.reference_labels(rows, op)
    out = ["<table><tr><th>headline</th>" + "".join(f"<th>{escape(r.split('/', 1)[1])}</th>" for r in refs)
           + "<th>best CUDA</th><th>best Triton</th></tr>"]
    from . import tables

    for direction, shape, dtype, note in tables.headlines(op):
        case = (direction, shape, dtype)
        cells = [f"<td>{throughput(site_data.at(rows, case, r))}</td>" for r in refs]
        for backend in ("cuda", "triton"):
            v, r = site_data.best_at(rows, case, rosetta.variants(op, backend))
            cells.append(f"<td>{link(v)}: {throughput(r)}</td>" if v else "<td>—</td>")
        out.append(f"<tr><td>{escape(tables.title(op, direction, shape, dtype, note))}</td>{''.join(cells)}</tr>")
    return "".join(out) + "</table>"


def op_html(op: str, rows: list[dict], ncu_rows: list[dict], plots: list[str]) -> str:
    ladder = []
    for cuda, triton in site_data.align(op):
        if cuda and triton:
            ladder.append("<tr>" + "".join(f"<td>{site_step.card(v, rows, ncu_rows)}</td>" for v in (cuda, triton))
                          + "</tr>")
        else:  # a step without a partner in the other ladder: the whole row is its
            v = cuda or triton
            ladder.append(f'<tr><td colspan="2" class="alone">{site_step.card(v, rows, ncu_rows)}</td></tr>')
    positional = not any(t.header.mirrors for t in rosetta.variants(op, "triton"))
    note = ("No Triton step of this op declares <code>Mirrors:</code>, so the ladders stand side by side by "
            "position, not by idea." if positional else
            "Each Triton step sits beside the CUDA step its <code>Mirrors:</code> line reaches; a Triton "
            "step that mirrors an earlier CUDA step gets a row of its own.")
    from . import tables

    in_order = [tables.plot_name(op, d, shape, dtype) for d, shape, dtype, _ in tables.headlines(op)]
    in_order += [tables.plot_name(op, d, kind="sweep") for d in SPECS[op].directions()]
    in_order += [f"{op}_ncu.png", f"suite_{op}.png"]  # the tables' order, then the sweeps, ncu, the suite
    in_order += [p for p in plots if p.startswith(op + "_")]  # any other plot of the op, last
    imgs = "".join(plot_link(p) for p in dict.fromkeys(in_order) if p in plots)
    body = (f"<h1>{op}</h1>{nav()}<h2>Headlines</h2>{summary_html(rows, op)}"
            f"<h2>Translation: what a Triton construct absorbs</h2>{translation_html(rows, op)}"
            f"<h2>Plots</h2>{imgs or '<p class=none>no plots</p>'}"
            f"<h2>The ladders</h2><p>{note}</p><table class=\"ladder\"><tr><th>CUDA</th><th>Triton</th></tr>"
            f"{''.join(ladder)}</table>")
    return page(f"kernel-rosetta: {op}", body)


def claims_html(rows: list[dict], folder: Path | None, env: dict) -> str:
    measured = ", ".join(str(env[k]) for k in ("gpu", "git_sha", "date_utc") if env.get(k))
    source = f"results/{folder.name}/bench.csv ({measured})" if folder else "no committed results"
    return page("kernel-rosetta: claims, measured",
                f"<h1>Claims, measured</h1>{nav()}{site_claims.body(rows, source)}")


def build(out: Path, folder: Path | None = None) -> list[Path]:
    """Write the site into `out`; returns the index and op pages written. claims.html is written
    beside them but not returned: tests/test_site.py pins the returned list to exactly those pages
    (tests/test_claims.py checks claims.html)."""
    folder = folder or reference_results()
    rows = results.read_rows(folder / "bench.csv") if folder else []
    ncu_rows = ncu.read_table(folder / "ncu.csv") if folder else []
    env = results.read_environment(folder / "environment.json") if folder else {}
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plots = []
    for png in sorted((folder / "plots").glob("*.png")) if folder else []:
        shutil.copyfile(png, out / "plots" / png.name)
        plots.append(png.name)
    written = [out / "index.html"]
    suite_csv = folder / "suite.csv" if folder else None
    suite_rows = results.read_rows(suite_csv) if suite_csv and suite_csv.exists() else []
    written[0].write_text(index_html(rows, env, plots, suite_rows))
    for op in rosetta.ops_with_steps():
        written.append(out / f"{op}.html")
        written[-1].write_text(op_html(op, rows, ncu_rows, plots))
    (out / "claims.html").write_text(claims_html(rows, folder, env))
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("site"), help="output folder (default: ./site)")
    parser.add_argument("--results", type=Path, default=None, help="results/<gpu> folder (default: the reference GPU's)")
    args = parser.parse_args(argv)
    pages = build(args.out, args.results)
    print(f"wrote {len(pages)} pages and claims.html to {args.out}/ (open {args.out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
