"""Everything made from results files: plots, and the generated blocks of README.md and
KERNEL_LOG.md. `make log` runs `python -m rosetta.bench.report`; bench and profile call it too."""
from __future__ import annotations

import json
import sys

import rosetta
from rosetta.ops import SPECS
from rosetta.registry import REPO

from . import environment, markers, results, tables

README = REPO / "README.md"


def plots(out_dir, rows, limits) -> list:
    from . import plots as p

    made = []
    for op in {r["op"] for r in rows}:
        dtype = str(SPECS[op].dtypes[0]).removeprefix("torch.")
        ceiling = limits.get(SPECS[op].ceiling)
        made.append(p.sweep_plot(rows, op, dtype, out_dir / "plots" / f"{op}_sweep.png", ceiling))
        made.append(p.ladder_plot(rows, op, dtype, out_dir / "plots" / f"{op}_ladder.png", ceiling))
    return [m for m in made if m]


NCU_PLOT = {"GB/s": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput, % of peak"),
            "TFLOP/s": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                        "tensor pipe active, % of peak")}


def ncu_plots(out_dir, ncu_rows) -> list:
    from . import plots as p

    made = []
    for op in rosetta.OPS:
        if rosetta.variants(op):
            metric, title = NCU_PLOT[SPECS[op].metric]
            made.append(p.ncu_plot(ncu_rows, op, metric, title, out_dir / "plots" / f"{op}_ncu.png"))
    return [m for m in made if m]


def reference_results():
    """The results folder the docs show: the reference GPU's (the first with a bench.csv)."""
    folders = sorted(p for p in environment.RESULTS.glob("*") if (p / "bench.csv").exists())
    return folders[0] if folders else None


def readme_blocks(folder) -> dict:
    rows = results.read_rows(folder / "bench.csv")
    env = results.read_environment(folder / "environment.json")
    blocks = {}
    rel = folder.relative_to(REPO)
    for op in rosetta.OPS:
        if not any(r["op"] == op for r in rows):
            continue
        dtype = str(SPECS[op].dtypes[0]).removeprefix("torch.")
        blocks[f"{op}/table"] = (
            f"{env.get('gpu')}, {dtype}, shape {SPECS[op].headline[0] if len(SPECS[op].headline) == 1 else SPECS[op].headline}; "
            f"torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda_runtime')}, "
            f"driver {env.get('driver')}, commit {env.get('git_sha')}, {env.get('date_utc')} UTC.\n\n"
            + tables.ladder_table(rows, op, dtype)
            + f"\n![{op} ladder]({rel}/plots/{op}_ladder.png)\n![{op} sweep]({rel}/plots/{op}_sweep.png)\n")
    if (folder / "hardware.md").exists():
        hw = json.loads((folder / "hardware.json").read_text())["measured"]
        blocks["roofline"] = (
            f"Ceilings measured by `make survey` ([hardware.md]({rel}/hardware.md)): DRAM copy "
            f"{hw['dram_copy_own']['median']:.0f} GB/s, read {hw['dram_read']['median']:.0f} GB/s, "
            f"L2 {hw['l2_read']['median']:.0f} GB/s, FP32 FMA {hw['fp32_fma']['tflops']:.1f} TFLOP/s, "
            f"cuBLAS bf16 {hw['tensor']['bf16']['median']:.0f} TFLOP/s.\n\n![roofline]({rel}/plots/roofline.png)\n")
    return blocks


def update_file(path, blocks: dict) -> bool:
    text = path.read_text()
    new = text
    for name in markers.names(text):
        if name in blocks:
            new = markers.replace(new, name, blocks[name])
    if new != text:
        path.write_text(new)
    return new != text


def regenerate() -> None:
    """Plots and docs from the committed results of every GPU folder."""
    from . import ceilings, ncu

    for folder in sorted(p for p in environment.RESULTS.glob("*") if (p / "bench.csv").exists()):
        hw = folder / "hardware.json"
        limits = ceilings.load(folder) if hw.exists() else {}
        rows = results.read_rows(folder / "bench.csv")
        plots(folder, rows, limits)
        ncu_plots(folder, ncu.read_table(folder / "ncu.csv"))
        if hw.exists():
            from rosetta.survey.roofline import plot as roofline

            roofline(json.loads(hw.read_text()), rows, folder / "plots" / "roofline.png")
    update_docs()


def update_docs() -> None:
    folder = reference_results()
    if folder is None:
        print("no results/*/bench.csv yet: nothing to put in the docs")
        return
    changed = update_file(README, readme_blocks(folder))
    from . import log

    changed |= log.update(folder)
    print(f"docs {'updated' if changed else 'already up to date'} from {folder.relative_to(REPO)}")


if __name__ == "__main__":
    regenerate()
    sys.exit(0)
