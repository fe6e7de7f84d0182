"""`make profile`: Nsight Compute over every tier and step, one ncu process per step.

Each child process builds its inputs, warms the step up (JIT, autotune, torch.compile) outside any
NVTX range, then launches it once inside `rosetta@<op>/<backend>/<step>`; ncu profiles only the
kernels inside the op's range (`--nvtx-include`), with `--clock-control none` (clocks untouched).
One process per step keeps every profiled kernel attributable to its step.

    python -m rosetta.bench.profile [--op OP] [--backend B] [--step N]
    python -m rosetta.bench.profile --child vector_add/cuda/01_naive   (what ncu runs)
"""
from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def find_subject(label: str):
    from .suite import subjects

    op = label.split("/")[0]
    for s in subjects(op):
        if s.label == label:
            return s
    raise SystemExit(f"unknown step label {label!r}")


def child(label: str) -> None:
    from rosetta.ops import SPECS

    from . import nvtx
    from .tiers import runner

    subject = find_subject(label)
    spec = SPECS[subject.op]
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = spec.make_inputs(spec.headline, spec.dtypes[0], "cuda", gen)
    out = spec.allocate(*inputs)
    fn = runner(subject, inputs, out)
    fn()  # warm-up outside the range: JIT, autotune and compile launches are not profiled
    torch.cuda.synchronize()
    with nvtx.step_range(label):
        fn()
    torch.cuda.synchronize()


def available_metrics(ncu: str) -> set[str]:
    """Base names ncu knows on this GPU (a single unknown metric makes ncu refuse to run)."""
    listing = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listing.splitlines() if line and not line.startswith(("-", " "))}


def profile_one(ncu: str, label: str, metrics: list[str], log: Path) -> subprocess.CompletedProcess:
    from . import nvtx

    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", nvtx.ncu_filter(label.split("/")[0]),
           "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base",
           "--log-file", str(log), sys.executable, "-m", "rosetta.bench.profile", "--child", label]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rosetta.bench.profile")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--op", action="append")
    p.add_argument("--backend")
    p.add_argument("--step", type=int)
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0

    import rosetta

    from . import environment, ncu as ncu_parse, report, results
    from .suite import subjects

    ncu = shutil.which("ncu") or "/opt/nvidia/nsight-compute/2025.3.1/ncu"
    if not torch.cuda.is_available() or not Path(ncu).exists():
        print("make profile needs a CUDA GPU and Nsight Compute (ncu); nothing to do here.")
        return 0
    start = time.monotonic()
    known = available_metrics(ncu)
    # launch__* are launch attributes, not counters: --query-metrics does not list them
    metrics = [m for m in ncu_parse.METRICS if m.startswith("launch__") or m.split(".")[0] in known]
    dropped = sorted(set(ncu_parse.METRICS) - set(metrics))
    if dropped:
        print(f"ncu on this GPU lacks: {', '.join(dropped)}")
    from rosetta import dispatch

    dispatch.ensure_loaded("cuda")  # build once here, not inside the first profiled child
    ops = args.op or rosetta.ops_with_steps()
    labels = [s.label for op in ops for s in subjects(op, args.backend, args.step)]
    out_dir = environment.results_dir()
    raw_rows, parsed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, label in enumerate(labels, 1):
            log = Path(tmp) / f"{i}.csv"
            t0 = time.monotonic()
            done = profile_one(ncu, label, metrics, log)
            text = log.read_text() if log.exists() else ""
            kernels = ncu_parse.parse_raw(text)
            status = f"{len(kernels)} kernel(s)" if kernels else f"NO KERNELS (rc {done.returncode})"
            print(f"[{i:3d}/{len(labels)} {time.monotonic() - start:5.0f}s] {label:42s} {status} "
                  f"in {time.monotonic() - t0:.1f} s", flush=True)
            if not kernels:
                print((done.stdout + done.stderr + text)[-3000:])
                continue
            parsed.append(ncu_parse.combine(label, kernels))
            header, units, *data = ncu_parse.csv_rows(text)
            raw_rows += [["rosetta_label", *header], ["", *units], *([label, *r] for r in data)]
    if not parsed:
        return 1
    keep_others = [r for r in ncu_parse.read_table(out_dir / "ncu.csv") if r["label"] not in set(labels)]
    order = {s.label: i for i, s in enumerate(s for op in rosetta.ops_with_steps() for s in subjects(op))}
    table = sorted(keep_others + parsed, key=lambda r: order.get(r["label"], 1e9))
    ncu_parse.write_table(out_dir / "ncu.csv", table)
    with (out_dir / "ncu_raw.csv").open("w", newline="") as f:
        # ncu's own raw CSV, one block per step (header, units, kernels), each row led by the label
        csv.writer(f).writerows(raw_rows)
    env = results.read_environment(out_dir / "environment.json")
    env["profile_wall_s"] = round(time.monotonic() - start, 1)
    env["profile_git_sha"] = environment.git_sha()
    env["ncu"] = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    results.write_environment(out_dir / "environment.json", env)
    report.regenerate()
    print(f"profiled {len(parsed)}/{len(labels)} steps in {time.monotonic() - start:.0f} s -> "
          f"{(out_dir / 'ncu.csv').relative_to(rosetta.registry.REPO)}")
    return 0 if len(parsed) == len(labels) else 1


if __name__ == "__main__":
    sys.exit(main())
