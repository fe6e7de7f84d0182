"""`make sanitize`: compute-sanitizer over every registered step -> results/<gpu>/sanitize.{md,csv}.

    python -m rosetta.bench.sanitize [--op OP] [--tool TOOL] [--jobs 6] [--timeout 300] [--budget 450]

One sanitizer process per (tool, op, backend): memcheck, racecheck, synccheck and initcheck for
CUDA steps, memcheck for Triton steps. Each runs bench/sanitize/driver.py, which launches every
step of the op once per direction x dtype x small tiling-breaking shape behind a marker line;
bench/sanitize/report.py attributes the sanitizer's findings to steps through those markers.
Before that, outside the sanitizer: the CUDA extension is built, and every Triton step runs once
(one process per step, in parallel) so its kernels are compiled into Triton's disk cache and the
sanitized runs only load them. Runs go in parallel (--jobs), each with a timeout, all within a
total budget: a run that cannot start in time is reported as not started. Exit status 1 when a
run failed or a step has device-side errors or race hazards.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rosetta.registry import REPO

from . import report

SELFCHECK = "selfcheck"  # the driver's planted fault, run under memcheck beside the real runs
TOOLS = {"cuda": ("memcheck", "racecheck", "synccheck", "initcheck"), "triton": ("memcheck",)}
ALL_TOOLS = TOOLS["cuda"]
# Used where `compute-sanitizer --help` lists them (older/newer releases differ).
COMMON_OPTIONS = [("--print-limit", "50"),  # a broken step prints thousands of identical errors
                  ("--target-processes", "application-only"),  # not ninja/nvcc/ptxas children
                  ("--show-backtrace", "device"),  # host frames are Python internals: the marker says more
                  # the sanitized Python process must connect within this many seconds; at the default
                  # (10 s) a start slowed by the parallel runs missed it ("No attachable process
                  # found") and the run then hung instead of failing
                  ("--launch-timeout", "90")]
TOOL_OPTIONS = {
    # keep going after a bad access (the default destroys the context: every later step would fail)
    "memcheck": [("--destroy-on-device-error", "kernel"), ("--padding", "512")],
    # analysis: one report per racing pair of accesses (hazard/all would print each hazard too)
    "racecheck": [("--racecheck-report", "analysis")],
}
WARM_TIMEOUT = 150  # seconds for one Triton step's unsanitized compile-and-run
CHILD_ENV = {
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",  # the caching allocator kept memory under the sanitizer (55 GB)
    "PYTHONUNBUFFERED": "1",
    "TRITON_PRINT_AUTOTUNING": "0",
}


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda",
             *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    try:
        from torch.utils.cpp_extension import CUDA_HOME
        homes.insert(0, CUDA_HOME or "")
    except Exception:
        pass
    for home in filter(None, homes):
        for path in (Path(home) / "bin" / "compute-sanitizer",
                     Path(home) / "compute-sanitizer" / "compute-sanitizer"):
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def known_options(sanitizer: str) -> set[str]:
    try:
        done = subprocess.run([sanitizer, "--help"], capture_output=True, text=True, timeout=60)
        text = done.stdout + done.stderr
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(re.findall(r"--[a-z][a-z-]+", text))


def command(sanitizer: str, tool: str, op: str, backend: str, known: set[str], shapes: int) -> list[str]:
    cmd = [sanitizer, "--tool", tool]
    for option, value in COMMON_OPTIONS + TOOL_OPTIONS.get(tool, []):
        if option in known or (option == "--print-limit" and not known):
            cmd += [option, value]
    return cmd + driver(op, backend, shapes)


def driver(op: str, backend: str, shapes: int, step: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "rosetta.bench.sanitize.driver"]
    if op == SELFCHECK:
        return cmd + ["--selfcheck"]
    cmd += ["--op", op, "--backend", backend, "--shapes", str(shapes)]
    return cmd + (["--step", str(step)] if step is not None else [])


def selfcheck_line(run: report.Run | None) -> str:
    """Did memcheck catch the planted fault, and only under the planted step's marker?"""
    if run is None:
        return "Self-check not run."
    rows = {r.step.rsplit("/", 1)[-1]: r for r in run.rows}
    planted, masked = rows.get("01_planted_oob"), rows.get("02_masked")
    if run.status == "ok" and planted and masked and planted.errors and masked.status == "ok" and masked.cases:
        return (f"Self-check: a planted out-of-bounds Triton load gave {planted.errors} memcheck errors, "
                "all under its own marker; the masked copy after it gave none: attribution works.")
    return (f"**Self-check FAILED** (status {run.status}; planted errors "
            f"{planted.errors if planted else '?'}, masked {masked.errors if masked else '?'}): "
            "a zero in this table may not mean clean. See .build/sanitize/memcheck-selfcheck-triton.log.")


@dataclass
class Result:
    returncode: int | None  # None: not started (the time budget was spent)
    timed_out: bool
    seconds: float
    restarted: bool = False


def run_logged(argv: list[str], log: Path, env: dict, limit: float, retry: bool = False,
               deadline: float = math.inf) -> Result:
    """One process, stdout and stderr together in `log` (the sanitizer's lines stay in order with
    the driver's markers), killed with its whole session after `limit` seconds. With `retry`, a
    run that timed out starts once more (its first log kept as <log>.timed-out) if 30 s remain
    before `deadline`, and stops by it."""
    began = time.monotonic()
    with open(log, "w") as handle:
        handle.write("$ " + shlex.join(argv) + "\n")
        handle.flush()
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                start_new_session=True)  # its own session: the kill reaches the python under it
        try:
            returncode, timed_out = proc.wait(timeout=limit), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            returncode, timed_out = proc.wait(), True
    left = deadline - time.monotonic()
    if timed_out and retry and left >= 30:
        log.replace(log.with_name(log.name + ".timed-out"))
        again = run_logged(argv, log, env, min(limit, left))
        return Result(again.returncode, again.timed_out, time.monotonic() - began, restarted=True)
    return Result(returncode, timed_out, time.monotonic() - began)


def run_all(tasks: dict, jobs: int, limit: float, deadline: float, env: dict, on_done) -> None:
    """tasks: name -> (argv, log, retry). At most `jobs` at a time, in the order given; a task that
    cannot start 30 s before the deadline is reported as not started; on_done(name, Result)."""
    def one(name):
        argv, log, retry = tasks[name]
        left = deadline - time.monotonic()
        result = run_logged(argv, log, env, min(limit, left), retry, deadline) if left >= 30 else Result(None, False, 0.0)
        on_done(name, result)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, tasks))


def build_cuda() -> str:
    """Build (or reuse) the CUDA extension outside the sanitizer; '' or why it failed."""
    try:
        from rosetta import cuda_build
        cuda_build.load()
        return ""
    except Exception as err:
        return f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", action="append", help="only this op (repeatable)")
    parser.add_argument("--tool", action="append", choices=ALL_TOOLS, help="only this tool (repeatable)")
    parser.add_argument("--backend", action="append", choices=tuple(TOOLS))
    parser.add_argument("--jobs", type=int, default=6, help="sanitizer processes at a time")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds per sanitizer process (runs take 10-35 s on the H100)")
    parser.add_argument("--budget", type=float, default=450, help="seconds for everything")
    parser.add_argument("--shapes", type=int, default=4, help="small test shapes per step")
    args = parser.parse_args(argv)
    began = time.monotonic()
    deadline = began + args.budget

    import rosetta
    from rosetta.ops import SPECS
    from .. import environment

    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin): "
              "install the CUDA toolkit's sanitizer or put it on PATH", file=sys.stderr)
        return 2
    env_info = environment.collect()
    out_dir = environment.results_dir(env_info["gpu"])
    log_dir = REPO / ".build" / "sanitize"
    log_dir.mkdir(parents=True, exist_ok=True)
    known = known_options(sanitizer)
    ops = [op for op in rosetta.ops_with_steps() if not args.op or op in args.op]
    backends = [b for b in TOOLS if not args.backend or b in args.backend]
    jobs = [(tool, op, b) for op in ops for b in backends if rosetta.variants(op, b)
            for tool in TOOLS[b] if not args.tool or tool in args.tool]
    print(f"compute-sanitizer: {sanitizer}; {len(jobs)} runs on {env_info['gpu']}; logs in {log_dir}")

    runs: dict[str, report.Run] = {}
    broken = build_cuda() if any(b == "cuda" for _, _, b in jobs) else ""
    if broken:
        print(f"CUDA build failed, CUDA runs skipped: {broken}")
        for tool, op, b in [j for j in jobs if j[2] == "cuda"]:
            runs[f"{tool} {op} {b}"] = failed_run(tool, op, b, f"build failed: {broken}")
        jobs = [j for j in jobs if j[2] != "cuda"]

    # Heaviest first: Triton (autotuned configs), then the ops with the most steps.
    def weight(job):
        tool, op, b = job
        return (b == "triton", len(rosetta.variants(op, b)) * len(SPECS[op].directions()),
                tool in ("memcheck", "racecheck"))
    jobs.sort(key=weight, reverse=True)
    # Triton kernels compile first, unsanitized, one process per step, into Triton's disk cache (the
    # sanitized runs then only load cubins; the caching allocator stays on there).
    warm = {f"warm {v.label}": (driver(op, "triton", args.shapes, v.step),
                                log_dir / f"warm-{v.label.replace('/', '-')}.log", False)
            for op in {op for _, op, b in jobs if b == "triton"} for v in rosetta.variants(op, "triton")}
    jobs.insert(0, ("memcheck", SELFCHECK, "triton"))
    commands = {f"{t} {o} {b}": command(sanitizer, t, o, b, known, args.shapes) for t, o, b in jobs}
    logs = {name: log_dir / f"{name.replace(' ', '-')}.log" for name in commands}
    env = {**os.environ, **CHILD_ENV}

    def warmed(name, result):
        state = "ok" if result.returncode == 0 else "timed out" if result.timed_out else f"exit {result.returncode}"
        print(f"  {name}: {state} ({result.seconds:.0f} s)", flush=True)

    caching = {k: v for k, v in env.items() if k != "PYTORCH_NO_CUDA_MEMORY_CACHING"}
    run_all(warm, args.jobs, WARM_TIMEOUT, deadline, caching, warmed)
    # A sanitized process has hung now and then on the H100 (a different run each time, which passes
    # in seconds on its next start; one such log read "No attachable process found", the reason for
    # --launch-timeout above): each run gets one more start after a timeout, and the report names
    # the runs that needed it.
    retried = []

    def finished(name, result):
        tool, op, b = name.split()
        expected = tuple((v.label, d) for v in rosetta.variants(op, b) for d in SPECS[op].directions()) \
            if op != SELFCHECK else ()
        if result.returncode is None:
            run = failed_run(tool, op, b, report.NOT_STARTED)
        else:
            run = report.parse(logs[name].read_text(errors="replace"), tool, op, b, returncode=result.returncode,
                               timed_out=result.timed_out, expected=expected)
        runs[name] = run
        if result.restarted:
            retried.append(name)
        errors = sum(r.errors for r in run.rows)
        hazards = sum(r.warnings for r in run.rows)
        print(f"[{len(runs):2d}/{len(commands)}] {tool:9s} {op}/{b}: {run.status}, {errors} errors"
              f"{f', {hazards} race warnings' if hazards else ''}{', restarted once' if result.restarted else ''} "
              f"({result.seconds:.0f} s)", flush=True)

    run_all({name: (argv, logs[name], SELFCHECK not in name) for name, argv in commands.items()},
            args.jobs, args.timeout, deadline, env, finished)

    check = selfcheck_line(runs.pop(f"memcheck {SELFCHECK} triton", None))
    print(check)
    # A run over some ops, backends or tools keeps the other runs of the committed table, and so
    # does a run that did not start in time.
    started = {(r.tool, r.op, r.backend) for r in runs.values() if r.status != report.NOT_STARTED}
    merged, kept, carried = report.merge_with_earlier(list(runs.values()), report.read_csv(out_dir / "sanitize.csv"))
    order = {op: i for i, op in enumerate(rosetta.OPS)}
    ordered = sorted(merged, key=lambda r: (order.get(r.op, 99), r.backend, ALL_TOOLS.index(r.tool)))
    tools = tuple(t for t in ALL_TOOLS if any(r.tool == t for r in ordered))
    lines = [shlex.join(cmd) for cmd in commands.values()]
    lines = [f"{k}={v}" for k, v in CHILD_ENV.items()] + [line.replace(str(REPO) + "/", "") for line in lines]
    text = report.markdown(ordered, tools, commands=lines, date=env_info["date_utc"] + " UTC",
                           gpu=env_info["gpu"], notes=[check, *report.restart_note(retried, args.timeout)]
                           + ([f"{kept} runs (tool, op, backend) not selected this time are kept from the "
                               "previous table; the date above is this run's."] if kept else [])
                           + ([f"{carried} runs did not start within the time budget: their rows are the "
                               "previous table's."] if carried else []))
    text += (f"\nLogs: {log_dir.relative_to(REPO)}/ (not committed). Driver: {sys.executable} "
             f"-m rosetta.bench.sanitize.driver; git {env_info['git_sha']}, torch {env_info['torch']}, "
             f"triton {env_info['triton']}, driver {env_info['driver']}.\n")
    (out_dir / "sanitize.md").write_text(text)
    report.write_csv(ordered, out_dir / "sanitize.csv")
    print(report.total_line(ordered))
    print(f"wrote {out_dir / 'sanitize.md'} and sanitize.csv ({time.monotonic() - began:.0f} s)")
    bad = any(run.status != "ok" or any(r.errors or r.warnings for r in run.rows)
              for run in ordered if (run.tool, run.op, run.backend) in started)
    bad = bad or "FAILED" in check or len(started) < len(runs)  # a run that did not start: incomplete
    return 1 if bad else 0


def failed_run(tool: str, op: str, backend: str, why: str) -> report.Run:
    """A run that produced no sanitizer output: one failure row."""
    row = report.Row(tool, op, backend, f"{op}/{backend}/{report.PROCESS}", status=why)
    return report.Run(tool, op, backend, rows=[row], status=why)


if __name__ == "__main__":
    sys.exit(main())
