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
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
class Task:
    name: str
    argv: list[str]
    log: Path  # stdout and stderr together: the sanitizer's lines stay in order with the markers
    env: dict = field(default_factory=dict)  # on top of the pool's; None removes a variable
    after: tuple = ()  # names of the tasks that must finish first
    timeout: float | None = None  # None: the pool's
    retries: int = 0  # runs started again after a timeout (the first log is kept as <log>.timed-out)


class Pool:
    """Up to `jobs` processes at a time, each with its own log and timeout, all inside a deadline."""

    def __init__(self, jobs: int, timeout: float, deadline: float, env: dict, cwd: Path):
        self.jobs, self.timeout, self.deadline, self.env, self.cwd = jobs, timeout, deadline, env, cwd

    def run(self, tasks: list[Task], on_done, on_retry=lambda name: None) -> None:
        """Start tasks in list order as slots free up; on_done(name, returncode, timed_out, seconds)
        once per task, returncode None for a task that could not start before the deadline. A task
        that times out with retries left and 30 s before the deadline starts again: on_retry(name)."""
        pending, running, finished = list(tasks), [], set()
        tries = {task.name: task.retries for task in tasks}
        by_name = {task.name: task for task in tasks}
        try:
            while pending or running:
                ready = [t for t in pending if set(t.after) <= finished]
                while ready and len(running) < self.jobs:
                    task = ready.pop(0)
                    pending.remove(task)
                    left = self.deadline - time.monotonic()
                    started = self._start(task, min(task.timeout or self.timeout, left)) if left >= 30 else None
                    if started is None:
                        finished.add(task.name)
                        on_done(task.name, None if left < 30 else 127, False, 0.0)
                    else:
                        running.append(started)
                if not running and not ready and pending:  # waits on a task that never ran: give up
                    for task in pending:
                        on_done(task.name, None, False, 0.0)
                    return
                time.sleep(0.5)
                for item in list(running):
                    name, proc, handle, start, limit = item
                    timed_out = proc.poll() is None and time.monotonic() - start > limit
                    if timed_out:
                        _kill(proc)
                        left = self.deadline - time.monotonic()
                        if tries[name] > 0 and left >= 30:
                            tries[name] -= 1
                            handle.close()
                            task = by_name[name]
                            task.log.replace(task.log.with_name(task.log.name + ".timed-out"))
                            running.remove(item)
                            restarted = self._start(task, min(task.timeout or self.timeout, left))
                            if restarted is not None:  # None: could not start (its log says why)
                                running.append(restarted)
                                on_retry(name)
                                continue
                            finished.add(name)
                            on_done(name, 127, True, time.monotonic() - start)
                            continue
                    if proc.poll() is not None:
                        handle.close()
                        running.remove(item)
                        finished.add(name)
                        on_done(name, proc.returncode, timed_out, time.monotonic() - start)
        finally:  # interrupted (Ctrl-C): leave no sanitizer behind
            for _, proc, handle, _, _ in running:
                _kill(proc)
                handle.close()

    def _start(self, task: Task, limit: float):
        handle = open(task.log, "w")
        handle.write("$ " + shlex.join(task.argv) + "\n")
        handle.flush()
        env = {k: v for k, v in {**self.env, **task.env}.items() if v is not None}
        try:
            proc = subprocess.Popen(task.argv, stdout=handle, stderr=subprocess.STDOUT, cwd=self.cwd,
                                    env=env, start_new_session=True)
        except OSError as err:
            handle.write(f"could not start: {err}\n")
            handle.close()
            return None
        return task.name, proc, handle, time.monotonic(), limit


def _kill(proc: subprocess.Popen) -> None:
    """The process's own session (start_new_session): the sanitizer and the python under it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


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
    from rosetta.registry import REPO

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
    jobs.insert(0, ("memcheck", SELFCHECK, "triton"))
    commands = {f"{t} {o} {b}": command(sanitizer, t, o, b, known, args.shapes) for t, o, b in jobs}
    logs = {name: log_dir / f"{name.replace(' ', '-')}.log" for name in commands}
    # Triton kernels compile first, unsanitized, one process per step, into Triton's disk cache; the
    # sanitized Triton run of an op waits for them and then only loads cubins. CUDA runs fill the
    # other slots meanwhile. (The caching allocator stays on there: it is not under the sanitizer.)
    warm = {op: [Task(f"warm {v.label}", driver(op, "triton", args.shapes, v.step),
                      log_dir / f"warm-{v.label.replace('/', '-')}.log",
                      env={"PYTORCH_NO_CUDA_MEMORY_CACHING": None}, timeout=WARM_TIMEOUT)
                 for v in rosetta.variants(op, "triton")] for _, op, b in jobs if b == "triton" and op != SELFCHECK}
    tasks = [Task(name, argv, logs[name]) for name, argv in commands.items() if SELFCHECK in name]
    tasks += [task for group in warm.values() for task in group]
    # A sanitized process has hung now and then on the H100 (a different run each time, which passes
    # in seconds on its next start; one such log read "No attachable process found", the reason for
    # --launch-timeout above): each run gets one more start after a timeout, and the report names
    # the runs that needed it.
    tasks += [Task(name, argv, logs[name], after=tuple(t.name for t in warm.get(name.split()[1], []))
                   if name.endswith(" triton") else (), retries=1)
              for name, argv in commands.items() if SELFCHECK not in name]
    retried = []

    def again(name):
        retried.append(name)
        print(f"  {name}: timed out, started again", flush=True)

    done = [0]

    def finished(name, returncode, timed_out, seconds):
        if name.startswith("warm "):
            state = "ok" if returncode == 0 else "timed out" if timed_out else f"exit {returncode}"
            print(f"  {name}: {state} ({seconds:.0f} s)", flush=True)
            return
        tool, op, b = name.split()
        expected = tuple((v.label, d) for v in rosetta.variants(op, b) for d in SPECS[op].directions()) \
            if op != SELFCHECK else ()
        if returncode is None:
            run = failed_run(tool, op, b, "not started (time budget)")
        else:
            text = logs[name].read_text(errors="replace")
            run = report.parse(text, tool, op, b, returncode=returncode, timed_out=timed_out,
                               expected=expected)
        runs[name] = run
        done[0] += 1
        errors = sum(r.errors for r in run.rows)
        hazards = sum(r.warnings for r in run.rows)
        print(f"[{done[0]:2d}/{len(commands)}] {tool:9s} {op}/{b}: {run.status}, {errors} errors"
              f"{f', {hazards} race warnings' if hazards else ''} ({seconds:.0f} s)", flush=True)

    Pool(args.jobs, args.timeout, deadline, {**os.environ, **CHILD_ENV}, REPO).run(tasks, finished, again)

    check = selfcheck_line(runs.pop(f"memcheck {SELFCHECK} triton", None))
    print(check)
    order = {op: i for i, op in enumerate(rosetta.OPS)}
    ordered = sorted(runs.values(), key=lambda r: (order.get(r.op, 99), r.backend, ALL_TOOLS.index(r.tool)))
    tools = tuple(t for t in ALL_TOOLS if any(r.tool == t for r in ordered))
    lines = [shlex.join(cmd) for cmd in commands.values()]
    lines = [f"{k}={v}" for k, v in CHILD_ENV.items()] + [line.replace(str(REPO) + "/", "") for line in lines]
    text = report.markdown(ordered, tools, commands=lines, date=env_info["date_utc"] + " UTC",
                           gpu=env_info["gpu"], notes=[check, *report.restart_note(retried, args.timeout)])
    text += (f"\nLogs: {log_dir.relative_to(REPO)}/ (not committed). Driver: {sys.executable} "
             f"-m rosetta.bench.sanitize.driver; git {env_info['git_sha']}, torch {env_info['torch']}, "
             f"triton {env_info['triton']}, driver {env_info['driver']}.\n")
    (out_dir / "sanitize.md").write_text(text)
    report.write_csv(ordered, out_dir / "sanitize.csv")
    print(report.total_line(ordered))
    print(f"wrote {out_dir / 'sanitize.md'} and sanitize.csv ({time.monotonic() - began:.0f} s)")
    bad = any(run.status != "ok" or any(r.errors or r.warnings for r in run.rows) for run in ordered)
    bad = bad or "FAILED" in check
    return 1 if bad else 0


def failed_run(tool: str, op: str, backend: str, why: str) -> report.Run:
    """A run that produced no sanitizer output: one failure row."""
    row = report.Row(tool, op, backend, f"{op}/{backend}/{report.PROCESS}", status=why)
    return report.Run(tool, op, backend, rows=[row], status=why)


if __name__ == "__main__":
    sys.exit(main())
