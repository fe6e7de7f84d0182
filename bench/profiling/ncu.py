"""Nsight Compute CSV (`ncu --csv --page raw --print-units base`) -> one row of metrics per step.

The raw CSV has a header row, a units row, then one row per profiled kernel; numbers may carry
thousands separators. A step may launch several kernels (a two-pass reduction): times and bytes
add up, percentages are averaged weighted by kernel time, registers and shared memory take the max."""
from __future__ import annotations

import csv
import io
from pathlib import Path

from .. import results

METRICS = [
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "lts__t_sector_hit_rate.pct",
    # what the SMs ask of L2 (32-byte sectors, loads and stores) and how busy that keeps it
    "lts__t_sectors_srcunit_tex.sum",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    # why warps wait: the stall a step removes shows up here
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    # matmul
    # on the H100 this counts wgmma as well as mma.sync/wmma (step 13: 90%); ncu has no gmma metric
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
]
SUMMED = {"gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_srcunit_tex.sum",
          "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
          "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
          "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"}
MAXED = {"launch__registers_per_thread", "launch__shared_mem_per_block_static",
         "launch__shared_mem_per_block_dynamic"}
UNIT_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1, "usecond": 1e3,
              "msecond": 1e6, "second": 1e9, "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
# Short names for tables: (column title, metric, format)
SHORT = [
    ("time (us)", "gpu__time_duration.sum", lambda v: f"{v / 1e3:.1f}"),
    ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed", lambda v: f"{v:.1f}"),
    ("DRAM MB", "dram_bytes", lambda v: f"{v / 1e6:.0f}"),
    ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", lambda v: f"{v:.1f}"),
    ("warps active %", "sm__warps_active.avg.pct_of_peak_sustained_active", lambda v: f"{v:.1f}"),
    ("regs", "launch__registers_per_thread", lambda v: f"{v:.0f}"),
    ("smem B", "smem_bytes", lambda v: f"{v:.0f}"),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", lambda v: f"{v:.1f}"),
    ("L2<->SM MB", "lts__t_sectors_srcunit_tex.sum", lambda v: f"{v * 32 / 1e6:.0f}"),
    ("L2 %", "lts__throughput.avg.pct_of_peak_sustained_elapsed", lambda v: f"{v:.1f}"),
    ("stall long-sb", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", lambda v: f"{v:.2f}"),
    ("stall barrier", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", lambda v: f"{v:.2f}"),
    ("tensor pipe %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", lambda v: f"{v:.1f}"),
    ("FFMA (G)", "sm__sass_thread_inst_executed_op_ffma_pred_on.sum", lambda v: f"{v / 1e9:.1f}"),
    ("smem ld conflicts (M)", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", lambda v: f"{v / 1e6:.2f}"),
    ("smem st conflicts (M)", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", lambda v: f"{v / 1e6:.2f}"),
]


def number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def csv_rows(text: str) -> list[list[str]]:
    """ncu's CSV rows, without the ==PROF== lines it prints around them."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_raw(text: str) -> list[dict]:
    """Kernel rows of one raw CSV: {'Kernel Name': str, metric: float in base units, ...}."""
    table = csv_rows(text)
    if len(table) < 2:
        return []
    return kernel_rows(table[0], table[1], table[2:])


def kernel_rows(header: list[str], units: list[str], data: list[list[str]]) -> list[dict]:
    kernels = []
    for values in data:
        row = {"Kernel Name": values[header.index("Kernel Name")] if "Kernel Name" in header else ""}
        for col, unit, value in zip(header, units, values):
            if col in METRICS:
                v = number(value)
                row[col] = None if v is None else v * UNIT_SCALE.get(unit.strip(), 1)
        kernels.append(row)
    return kernels


def read_raw(path: Path) -> dict[str, list[dict]]:
    """The committed ncu_raw.csv (every step's raw CSV, each row led by its label) -> kernels per
    step label, parsed as parse_raw does."""
    with path.open() as f:
        rows = list(csv.reader(f))
    steps: dict[str, list[dict]] = {}
    header = units = None
    for i, row in enumerate(rows):
        if row[0] == "rosetta_label":
            header, units = row[1:], rows[i + 1][1:]
        elif row[0] and header:
            steps.setdefault(row[0], []).extend(kernel_rows(header, units, [row[1:]]))
    return steps


def combine(label: str, kernels: list[dict], direction: str = "forward", dtype: str = "", shape: str = "") -> dict:
    """One step's kernels (in one direction, at one profiled shape) -> one row."""
    row = {"label": label, "direction": direction, "dtype": dtype, "shape": shape, "kernels": len(kernels),
           "kernel_names": ";".join(k["Kernel Name"][:60] for k in kernels)}
    times = [k.get("gpu__time_duration.sum") or 0.0 for k in kernels]
    total = sum(times)
    for metric in METRICS:
        values = [k.get(metric) for k in kernels]
        if all(v is None for v in values):
            row[metric] = None
        elif metric in SUMMED:
            row[metric] = sum(v or 0.0 for v in values)
        elif metric in MAXED:
            row[metric] = max(v or 0.0 for v in values)
        else:
            row[metric] = sum((v or 0.0) * t for v, t in zip(values, times)) / total if total else values[0]
    row["dram_bytes"] = (row["dram__bytes_read.sum"] or 0.0) + (row["dram__bytes_write.sum"] or 0.0)
    row["smem_bytes"] = (row["launch__shared_mem_per_block_static"] or 0.0) + \
                        (row["launch__shared_mem_per_block_dynamic"] or 0.0)
    return row


COLUMNS = ["label", "direction", "dtype", "shape", "kernels", "kernel_names", *METRICS, "dram_bytes", "smem_bytes"]
TEXT_COLUMNS = 6  # label .. kernel_names


def write_table(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in COLUMNS})


def read_table(path: Path) -> list[dict]:
    rows = results.read_csv(path)
    for row in rows:
        for key in COLUMNS[TEXT_COLUMNS:]:
            row[key] = number(row[key]) if row.get(key) not in (None, "") else None
        row["kernels"] = int(row["kernels"])
    return rows


def minimal_bytes(row: dict) -> float | None:
    """The op's minimal bytes at the shape and dtype the row was profiled at."""
    import math

    import torch

    from rosetta.ops import SPECS

    spec = SPECS[row["label"].split("/")[0]]
    if row.get("shape"):
        shape, dtype = results.shape_of(row["shape"]), getattr(torch, row["dtype"])
    else:  # recorded before rows carried their case: the first headline, first dtype
        shape, dtype = spec.headlines[0].shape, spec.headlines[0].dtypes[0]
    nbytes = spec.directions()[row.get("direction") or "forward"].minimal_bytes(shape, dtype)
    return nbytes if math.isfinite(nbytes) and nbytes > 0 else None


def step_table(ncu_rows: list[dict], v) -> str:
    """The ncu lines of one step (each direction), with deltas against the previous step."""
    import rosetta

    prev_label = rosetta.variants(v.op, v.backend)[v.step - 2].label if v.step > 1 else None
    lines = []
    for mine in (r for r in ncu_rows if r["label"] == v.label):
        prev = next((r for r in ncu_rows if r["label"] == prev_label and r["direction"] == mine["direction"]
                     and r.get("shape") == mine.get("shape") and r.get("dtype") == mine.get("dtype")), None)
        cols = [c for c in SHORT if mine.get(c[1]) is not None]
        minimal = minimal_bytes(mine)
        case = " ".join(p for p in (mine["direction"], mine.get("dtype"), mine.get("shape")) if p)
        head = f"| ncu ({case}) | kernels | " + " | ".join(c[0] for c in cols) + " | DRAM bytes / minimal |"
        cells = [fmt(mine[m]) for _, m, fmt in cols] + [f"{mine['dram_bytes'] / minimal:.3f}" if minimal else ""]
        lines += ([""] if lines else []) + [head, "|---|--:|" + "--:|" * (len(cols) + 1),
                                            f"| this step | {mine['kernels']} | " + " | ".join(cells) + " |"]
        if prev:
            deltas = []
            for _, m, _ in cols:
                a, b = mine.get(m), prev.get(m)
                deltas.append("" if a is None or b is None else
                              (f"{a - b:+.1f}" if m.endswith("pct") or "pct_of" in m else _ratio(a, b)))
            lines.append(f"| Δ vs step {v.step - 1} | {mine['kernels'] - prev['kernels']:+d} | "
                         + " | ".join(deltas) + " | |")
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    if b == 0:
        return "" if a == 0 else "new"
    return f"{a / b:.2f}x"
