"""`make profile`: Nsight Compute over every tier and step, one ncu process per op.

The child process builds each subject's inputs at its profile case (the op's first headline shape
inside the subject's declared limits, or the spec's profile_shape, in the first dtype it takes,
each direction), warms everything up (JIT, autotune, torch.compile) outside any NVTX range, then
launches each subject once inside `rosetta@<op>/<backend>/<step>`, preceded by a one-thread marker kernel in its own range. ncu
profiles only the kernels inside the op's ranges (`--nvtx-include`) with `--clock-control none`
(clocks untouched); the markers split its kernel list into one group per subject, so a subject
that launches several kernels (a two-pass reduction) is attributed exactly.

    python -m rosetta.bench.profiling [--op OP]
    python -m rosetta.bench.profiling --child softmax     (what ncu runs)
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

MARKER = "rosetta_profile_marker"
CASES_LINE = "ROSETTA-CASES "


def cases(op: str) -> list[tuple]:
    """(subject, direction, shape, dtype) for every tier and step of op."""
    from rosetta.ops import SPECS

    from ..run.suite import subjects, takes, Group

    spec = SPECS[op]
    candidates = [(h.shape, h.dtypes) for h in spec.headlines]
    if spec.profile_shape is not None:
        candidates = [(spec.profile_shape, spec.headlines[0].dtypes)]
    found = []
    for subject in subjects(op):
        for direction in spec.directions():
            for shape, dtypes in candidates:
                dtype = next((d for d in dtypes if d in subject.dtypes), None)
                if dtype is not None and takes(subject, Group(op, direction, dtype, shape, "headline")) \
                        and within_limits(subject, direction, shape, dtype):
                    found.append((subject, direction, shape, dtype))
                    break
    return found


def within_limits(subject, direction: str, shape: tuple, dtype) -> bool:
    """A step's declared limits (`Max:`/`Min:`) hold at this shape: judged on meta stand-ins, so a
    step meant for a range of shapes is profiled at the first headline inside it."""
    import rosetta
    from rosetta import dispatch
    from rosetta.ops import SPECS

    if subject.backend not in rosetta.BACKENDS:
        return True
    stand_ins = SPECS[subject.op].directions()[direction].make_inputs(shape, dtype, "meta", None)
    return not dispatch.exceeded(subject, stand_ins)


def _marker():
    import triton
    import triton.language as tl

    @triton.jit
    def rosetta_profile_marker(ptr):
        tl.store(ptr, 1.0)

    return rosetta_profile_marker


def child(op: str) -> None:
    from rosetta.ops import SPECS

    from ..run import nvtx
    from ..run.tiers import runner

    marker, flag = _marker(), torch.zeros(1, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs_by_case, ready = {}, []
    for subject, direction, shape, dtype in cases(op):
        d = SPECS[op].directions()[direction]
        key = (direction, shape, dtype)
        if key not in inputs_by_case:
            inputs_by_case[key] = d.make_inputs(shape, dtype, "cuda", gen)
        inputs = inputs_by_case[key]
        try:
            t0 = time.monotonic()
            fn, _ = runner(subject, direction, inputs, d.allocate(*inputs))
            fn()  # warm-up outside the ranges: JIT, autotune and compile launches are not profiled
            torch.cuda.synchronize()
            print(f"ready {subject.label} {direction} in {time.monotonic() - t0:.1f} s", flush=True)
        except Exception as exc:  # refused or broken: the bench reports it; nothing to profile
            print(f"skip {subject.label} {direction}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        ready.append((subject, direction, shape, dtype, fn))
    marker[(1,)](flag)
    torch.cuda.synchronize()
    for i, (subject, direction, *_, fn) in enumerate(ready):
        t0 = time.monotonic()
        with nvtx.step_range(f"{op}/marker/{i}"):
            marker[(1,)](flag)
        with nvtx.step_range(subject.label):
            fn()
        torch.cuda.synchronize()
        print(f"profiled {subject.label} {direction} in {time.monotonic() - t0:.1f} s", flush=True)
    described = [{"label": s.label, "direction": d, "shape": "x".join(map(str, shape)),
                  "dtype": str(dtype).removeprefix("torch.")} for s, d, shape, dtype, _ in ready]
    print(CASES_LINE + json.dumps(described), flush=True)


def split_by_marker(kernels: list[dict], described: list[dict]) -> list[tuple[dict, list[dict]]]:
    """The kernels after each marker belong to the case the child launched after it."""
    groups, current = [], None
    for k in kernels:
        if MARKER in k.get("Kernel Name", ""):
            current = []
            groups.append(current)
        elif current is not None:
            current.append(k)
    return [(case, group) for case, group in zip(described, groups) if group]


def kept_raw_blocks(path: Path, redone: set[str]) -> list[list[str]]:
    """The rows of ncu_raw.csv's blocks (a "rosetta_op" header, a units row, the op's kernels) for
    ops not profiled again this time: profiling one op keeps the others' raw data."""
    if not path.exists():
        return []
    blocks: list[list[list[str]]] = []
    with path.open() as f:
        for row in csv.reader(f):
            if row and row[0] == "rosetta_op":
                blocks.append([row])
            elif blocks:
                blocks[-1].append(row)
    return [row for block in blocks if not any(r and r[0] in redone for r in block[2:]) for row in block]


def available_metrics(ncu: str) -> set[str]:
    """Base names ncu knows on this GPU (a single unknown metric makes ncu refuse to run)."""
    listing = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listing.splitlines() if line and not line.startswith(("-", " "))}


def profile_op(ncu: str, op: str, metrics: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    from ..run import nvtx

    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", nvtx.ncu_filter(op),
           "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base",
           "--log-file", str(log), sys.executable, "-m", "rosetta.bench.profiling", "--child", op]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # say how far the child got
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(cmd, -9, out, f"ncu ran past {exc.timeout:.0f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rosetta.bench.profiling")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--op", action="append")
    p.add_argument("--timeout", type=float, default=560, help="seconds one op's ncu process may take")
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0

    import rosetta

    from .. import environment, results
    from . import ncu as ncu_parse

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
    from rosetta import cuda_build

    cuda_build.load()  # build once here, not inside the first profiled child
    ops = args.op or rosetta.ops_with_steps()
    out_dir = environment.results_dir()
    parsed, raw_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for op in ops:
            log, t0 = Path(tmp) / f"{op}.csv", time.monotonic()
            done = profile_op(ncu, op, metrics, log, args.timeout)
            text = log.read_text() if log.exists() else ""
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith(CASES_LINE)), None)
            if line is None:
                print(f"{op}: the child did not finish (rc {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
                continue
            described = json.loads(line[len(CASES_LINE):])
            groups = split_by_marker(ncu_parse.parse_raw(text), described)
            for case, kernels in groups:
                parsed.append(ncu_parse.combine(case["label"], kernels, case["direction"], case["dtype"], case["shape"]))
            header, units, *data = ncu_parse.csv_rows(text)
            raw_rows += [["rosetta_op", *header], ["", *units], *([op, *r] for r in data)]
            print(f"{op}: {len(groups)}/{len(described)} cases profiled in {time.monotonic() - t0:.0f} s", flush=True)
    if not parsed:
        return 1
    done_ops = {r["label"].split("/")[0] for r in parsed}
    keep = [r for r in ncu_parse.read_table(out_dir / "ncu.csv") if r["label"].split("/")[0] not in done_ops]
    ncu_parse.write_table(out_dir / "ncu.csv", keep + parsed)
    raw_rows = kept_raw_blocks(out_dir / "ncu_raw.csv", done_ops) + raw_rows
    with (out_dir / "ncu_raw.csv").open("w", newline="") as f:
        csv.writer(f).writerows(raw_rows)  # ncu's own raw CSV, one block per op, markers included
    env = results.read_environment(out_dir / "environment.json")
    env.update(profile_wall_s=round(time.monotonic() - start, 1), profile_git_sha=environment.git_sha(),
               ncu=subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1])
    results.write_environment(out_dir / "environment.json", env)
    print(f"profiled {len(parsed)} cases in {time.monotonic() - start:.0f} s -> "
          f"{(out_dir / 'ncu.csv').relative_to(rosetta.registry.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
