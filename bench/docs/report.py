"""Everything made from results files: plots, and the generated blocks of README.md and
KERNEL_LOG.md. `make docs` runs `python -m rosetta.bench.docs`; bench and profile call it too."""
from __future__ import annotations

import os
from pathlib import Path

import json

import rosetta
from rosetta.ops import SPECS
from rosetta.registry import REPO

from .. import ceilings, environment, results
from ..sanitize import report as sanitize_report
from . import claims, markers, prose, tables

README = REPO / "README.md"
METHOD = REPO / "bench" / "METHOD.md"  # how it measures, the GPU box, the claims, adding a step


def plots(out_dir, rows, limits) -> list:
    from . import plots as p

    made = []
    for op in sorted({r["op"] for r in rows}, key=rosetta.OPS.index):
        spec = SPECS[op]
        sweep_dtype = str(spec.sweep_dtype).removeprefix("torch.")
        for direction in spec.directions():
            ceiling = ceilings.ceiling_for(limits, spec.ceiling, sweep_dtype)[0] if limits else None
            made.append(p.sweep_plot(rows, op, direction, sweep_dtype,
                                     out_dir / "plots" / tables.plot_name(op, direction, kind="sweep"), ceiling))
        for direction, shape, dtype, _ in tables.headlines(op):
            ceiling = table_ceiling(tables.headline_rows(rows, op, direction, shape, dtype)) or \
                (ceilings.ceiling_for(limits, spec.ceiling, dtype)[0] if limits else None)
            made.append(p.ladder_plot(rows, op, direction, shape, dtype,
                                      out_dir / "plots" / tables.plot_name(op, direction, shape, dtype), ceiling))
    return [m for m in made if m]


def table_ceiling(rows: list[dict]) -> float | None:
    """The ceiling a ladder table's "% of measured ceiling" divided by (the survey's probe, or a
    library kernel measured faster on those inputs), read back from its rows: the plot draws the
    same line the table used."""
    for r in rows:
        if r.get("throughput") and r.get("pct_of_ceiling"):
            return r["throughput"] / r["pct_of_ceiling"] * 100
    return None


NCU_PLOT = {"GB/s": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput, % of peak"),
            "TFLOP/s": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput, % of peak")}


def ncu_plots(out_dir, ncu_rows) -> list:
    from . import plots as p

    made = []
    for op in rosetta.ops_with_steps():
        metric, title = NCU_PLOT[SPECS[op].metric]
        made.append(p.ncu_plot(ncu_rows, op, metric, title, out_dir / "plots" / f"{op}_ncu.png"))
    return [m for m in made if m]


def reference_results():
    """The results folder the docs show: the reference GPU's (the first with a bench.csv)."""
    folders = sorted(p for p in environment.RESULTS.glob("*") if (p / "bench.csv").exists())
    return folders[0] if folders else None


def _changed_note(folder, op, base=None) -> str:
    changed = results.changed_since_run(folder, rosetta.variants(op))
    if not changed:
        return ""
    prefix = Path(os.path.relpath(REPO, base or folder))
    return ("\n\nChanged since the run that measured them (their rows measured the earlier code): "
            + ", ".join(f"[`{v.label}`]({prefix / v.source}) (run {run})" for v, run in changed.items()) + ".")


def readme_blocks(folder, base=REPO) -> dict:
    """Every generated block, its links relative to `base` (the folder of the file it goes in)."""
    rows = results.read_rows(folder / "bench.csv")
    rel = Path(os.path.relpath(folder, base))
    blocks = {}
    for op in rosetta.OPS:
        if not any(r["op"] == op for r in rows):
            continue
        blocks[f"{op}/best"] = (tables.best_table(rows, op) + f"\n\nEvery step at every headline shape, with "
                                f"its plot: [{rel}/{op}.md]({rel}/{op}.md).")
    if (folder / "hardware.md").exists():
        limits = ceilings.load(folder)
        blocks["roofline"] = (
            f"Ceilings measured by `make survey` ([hardware.md]({rel}/hardware.md)): "
            + ceilings.summary(limits) + f"\n\n![roofline]({rel}/plots/roofline.png)\n")
    flush = folder / "flush.md"
    if flush.exists():
        blocks["flush"] = flush.read_text()
    blocks["claims"] = ("Checked by the report's claims page (`make site`, then site/claims.html), "
                        "from the committed results:\n\n" + claims.markdown_summary(rows))
    sanitize = folder / "sanitize.md"
    if sanitize.exists():
        blocks["sanitize"] = f"[{rel}/sanitize.md]({rel}/sanitize.md): " + _sanitize_total(sanitize.read_text())
    if (folder / "suite.csv").exists():
        blocks["suite"] = suite_block(folder, rel)
    overhead = folder / "overhead.csv"
    if overhead.exists():
        blocks["overhead"] = overhead_table(results.read_rows(overhead)) + \
            f"\n\nEvery layer under the call: [{rel}/overhead.md]({rel}/overhead.md)."
    return blocks


def overhead_table(rows: list[dict]) -> str:
    """Host us per call on a tiny input: torch's call and each backend's public call, with and
    without requires_grad (overhead.csv holds the layers under them too). Each backend's figure
    carries its step and its multiple of torch's call in the same run: the H100's hosts move
    every figure by up to ~1.5x from run to run, the ratio much less."""
    lines = ["| op | input | torch | CUDA | Triton | torch, requires_grad | CUDA, requires_grad | "
             "Triton, requires_grad |", "|---|---|--:|--:|--:|--:|--:|--:|"]
    for op in rosetta.OPS:
        mine = [r for r in rows if r["op"] == op]
        if not mine:
            continue

        def call(backend, grad):
            hit = [r for r in mine if r["backend"] == backend and r["name"].startswith("call")
                   and ("requires_grad" in r["name"]) == grad]
            return hit[0] if hit else None

        def us(backend, grad):
            row, torch_row = call(backend, grad), call("torch", grad)
            if row is None:
                return "-"
            text = f"{row['p50_ms'] * 1e3:.1f}"
            if backend == "torch":
                return text
            notes = [row["name"].partition("(")[2].rstrip(")")]
            if torch_row is not None:
                notes.append(f"{row['p50_ms'] / torch_row['p50_ms']:.1f}x torch")
            return f"{text} ({', '.join(n for n in notes if n)})"
        lines.append(f"| {op} | {mine[0]['dtype']} {mine[0]['shape']} | "
                     + " | ".join(us(b, g) for g in (False, True) for b in ("torch", "cuda", "triton")) + " |")
    return "\n".join(lines)


def op_pages(folder) -> None:
    """results/<gpu>/<op>.md: every ladder table of the op, with its plots (README shows the best)."""
    rows = results.read_rows(folder / "bench.csv")
    env = results.read_environment(folder / "environment.json")
    for op in rosetta.OPS:
        if not any(r["op"] == op for r in rows):
            continue
        runs = sorted({r["git_sha"] for r in rows if r["op"] == op and r.get("git_sha")})
        (folder / f"{op}.md").write_text(
            f"# {op} on {env.get('gpu')}\n\nGenerated by `make docs` from bench.csv (rows of run"
            f"{'s' if len(runs) > 1 else ''} {', '.join(runs) or env.get('git_sha')}; the environment of the "
            f"latest run, {env.get('git_sha')}, {env.get('date_utc')} UTC: torch {env.get('torch')}, triton {env.get('triton')}, CUDA "
            f"{env.get('cuda_runtime')}). How to read a table: [bench/METHOD.md](../../bench/METHOD.md). "
            f"\"% of measured ceiling\" divides by the best probe `make survey` measured; \"% of theoretical "
            f"peak\" by the datasheet arithmetic; \"error / tol.\" is the worst elementwise error over the "
            f"step's tolerance (1.00 = at the limit).\n\n"
            + tables.op_tables(rows, op, folder, level="##", base=folder) + _changed_note(folder, op)
            + "\n")


def suite_block(folder, rel) -> str:
    """The shape suite's summary, with the heatmaps and a link to every case."""
    from rosetta import dispatch_table

    from . import suite_report

    rows = results.read_rows(folder / "suite.csv")
    table = dispatch_table.read(folder / dispatch_table.TABLE_NAME)
    maps = [f"![{op} suite]({rel}/plots/suite_{op}.png)" for op in rosetta.OPS
            if (folder / "plots" / f"suite_{op}.png").exists()]
    return (suite_report.summary_table(rows, table) + f"\n\nEvery case, step by step: "
            f"[{rel}/suite.md]({rel}/suite.md); the table step=None reads: "
            f"[{rel}/{dispatch_table.TABLE_NAME}]({rel}/{dispatch_table.TABLE_NAME}).\n\n" + " ".join(maps))


def _sanitize_total(text: str) -> str:
    """The report's total line, and how many runs needed a second start."""
    total = [line for line in text.splitlines() if line.lower().startswith(("**total", "total"))]
    again = sanitize_report.restarts(text)
    restarted = f" {again} of them hung once and passed on a second start." if again else ""
    return (total[0].strip("* ") + restarted) if total else "see the file"


def update_file(path, blocks: dict, figures) -> bool:
    """Rewrite `path`'s generated blocks and the measured figures of its prose (bench.docs.prose)."""
    text = path.read_text()
    new = text
    for name in markers.names(text):
        if name in blocks:
            new = markers.replace(new, name, blocks[name])
    new = prose.render(new, figures)
    if new != text:
        path.write_text(new)
    return new != text


def regenerate() -> None:
    """Plots and docs from the committed results of every GPU folder."""
    from ..profiling import ncu

    for folder in sorted(p for p in environment.RESULTS.glob("*") if (p / "bench.csv").exists()):
        hw = folder / "hardware.json"
        limits = ceilings.load(folder) if hw.exists() else {}
        rows = results.read_rows(folder / "bench.csv")
        if limits:  # the survey may be newer than the bench: percentages follow the ceilings
            ceilings.apply_to_rows(rows, limits, SPECS)
            results.write_rows(folder / "bench.csv", rows, replace_all=True)
        plots(folder, rows, limits)
        ncu_plots(folder, ncu.read_table(folder / "ncu.csv"))
        if hw.exists():
            from rosetta.survey.roofline import plot as roofline

            roofline(json.loads(hw.read_text()), rows, folder / "plots" / "roofline.png")
        if (folder / "suite.csv").exists():
            from . import suite_report

            suite_report.write(folder, results.read_rows(folder / "suite.csv"))
    update_docs()


def update_docs() -> None:
    folder = reference_results()
    if folder is None:
        print("no results/*/bench.csv yet: nothing to put in the docs")
        return
    op_pages(folder)
    from ..sanitize.sanitizer import ALL_TOOLS

    sanitize_report.rerender(folder / "sanitize.md", folder / "sanitize.csv", ALL_TOOLS)  # this code's tables, the run's data
    figures = prose.Data.load(folder)  # the results behind every placeholder, read once
    changed = update_file(README, readme_blocks(folder), figures)
    if METHOD.exists():
        changed |= update_file(METHOD, readme_blocks(folder, base=METHOD.parent), figures)
    from . import log

    changed |= log.update(folder, figures)
    print(f"docs {'updated' if changed else 'already up to date'} from {folder.relative_to(REPO)}")

