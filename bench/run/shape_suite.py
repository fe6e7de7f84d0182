"""The shape suite (`python -m rosetta.bench --suite`): the shapes users bring, every step on each.

Per case of an op spec's `suite` (forward): torch eager (the vendor library: cuBLAS, torch's own
kernels) and every step of both backends that takes the dtype are checked against fp64 and timed
as CUDA-graph replays in turns (bench.suite.run_group, the ladder tables' method; a step whose
graph replay takes 4x its backend's fastest so far is not timed). The fastest right step of each backend per case
becomes the dispatch table (results/<gpu>/dispatch.json, read by step=None). Then, with that table
in force, each case is timed again as a user calls it: torch's own call and rosetta.<op>(...,
backend=b) in an eager loop (allocation, checks, dispatch, launch; no flush), so that host cost
shows wherever it outweighs the kernel. bench.docs.suite_report turns the rows into the summary and heatmaps.
"""
from __future__ import annotations

import dataclasses
import time

import torch

import rosetta
from rosetta import calls, dispatch_table, timing
from rosetta.ops import SPECS

from .. import results
from . import suite
from .tiers import tiers

EAGER_MIN_MS = 20.0  # an eager caller's rounds run at least this long together
EAGER_ROUNDS = 5  # rounds in turns; the median round is reported
EAGER_MAX_CALLS = 2000  # calls in one round at most


def plan(ops, dtypes=None) -> list[suite.Group]:
    """The suite's cases of `ops` (only those of `dtypes`, if given), forward."""
    return [suite.Group(op, "forward", dtype, shape, "suite")
            for op in ops if SPECS[op].suite for shape, dtype in SPECS[op].suite.cases
            if dtypes is None or dtype in dtypes]


def subjects(op: str, dtype, backends=rosetta.BACKENDS) -> list:
    """torch eager, then every step of each backend that takes dtype, the last (most optimized)
    first, so that the slow-step cut (bench.suite.SUITE_SLOWER) meets the early rungs after a
    fast one. A step with a declared hazard is left out: step=None never runs it."""
    eager = [t for t in tiers(op) if t.name == "eager"]
    return eager + [v for b in backends for v in reversed(rosetta.variants(op, b))
                    if dtype in v.dtypes and not v.hazard]


def table_entries(rows: list[dict]) -> list[dispatch_table.Entry]:
    """Per case and backend: the steps that were right and timed, fastest first."""
    entries = []
    cases = {(r["op"], r["dtype"], r["shape"]) for r in rows if r["role"] == "suite"}
    for op, dtype, shape in sorted(cases, key=lambda c: (c[0], c[1], results.shape_of(c[2]))):
        dims = results.shape_of(shape)
        for backend in rosetta.BACKENDS:
            timed = sorted((r["p50_ms"], r["step"]) for r in rows
                           if (r["op"], r["dtype"], r["shape"], r["backend"]) == (op, dtype, shape, backend)
                           and r["role"] == "suite" and r["status"] == "ok")
            if timed:
                entries.append(dispatch_table.Entry(op, backend, dtype, dims, suite_layout(op, dims, dtype),
                                                    tuple((step, ms) for ms, step in timed)))
    return entries


def headline_entries(bench_rows: list[dict]) -> list[dispatch_table.Entry]:
    """For each op: per forward headline case and backend, the steps that were right, fastest first
    (and, where the backward was timed too, by forward + backward: grad_ranking), from bench.csv,
    where every step is timed at the headlines (a sweep times only the chosen step, so it ranks
    nothing). Cases that give the same problem shape (attention causal or not: causal is a
    parameter, not an input) keep the first."""
    entries, seen = [], set()
    timed = [r for r in bench_rows if r["role"] == "headline" and r["status"] == "ok"
             and r["backend"] in rosetta.BACKENDS and r["op"] in SPECS]
    ok = [r for r in timed if r["direction"] == "forward"]
    backward = {(r["op"], r["dtype"], r["shape"], r["backend"], r["label"]): float(r["p50_ms"])
                for r in timed if r["direction"] == "backward"}
    hazardous = {v.label for v in rosetta.variants() if v.hazard}
    cases = sorted({(r["op"], r["dtype"], r["shape"]) for r in ok}, key=lambda c: (c[0], c[1], len(c[2]), c[2]))
    for op, dtype, shape in cases:
        dims = results.shape_of(shape)
        inputs = SPECS[op].forward.make_inputs(dims, getattr(torch, dtype), "meta", None)
        problem, layout = SPECS[op].problem_shape(*inputs), dispatch_table.layout_class(inputs)
        for backend in rosetta.BACKENDS:
            mine = [r for r in ok if (r["op"], r["dtype"], r["shape"], r["backend"]) == (op, dtype, shape, backend)
                    and r["label"] not in hazardous]
            if not mine or (op, backend, dtype, problem) in seen:
                continue
            seen.add((op, backend, dtype, problem))
            fastest_first = sorted(mine, key=lambda r: float(r["p50_ms"]))
            ranking = tuple((int(r["step"]), float(r["p50_ms"])) for r in fastest_first)
            pairs = [(float(r["p50_ms"]) + backward[key], int(r["step"])) for r in mine
                     if (key := (op, dtype, shape, backend, r["label"])) in backward]
            entries.append(dispatch_table.Entry(op, backend, dtype, problem, layout, ranking, "headline",
                                                mine[0]["git_sha"], tuple((s, ms) for ms, s in sorted(pairs))))
    return entries


def with_headlines(suite_entries: list, headlines: list) -> list:
    """The suite's cases, then the headline cases the suite does not have (rows of 32,768 for the
    norms, whose suite stops at 16,384: without them such a call took the choice of a neighbour
    that another step wins). Where a headline case is also a suite case, the suite's forward
    ranking stays and takes the headline's forward + backward one (the suite times the forward
    only)."""
    def key(e):
        return e.op, e.backend, e.dtype, e.shape, e.layout
    by_case = {key(e): e for e in headlines}
    merged = [dataclasses.replace(e, grad_ranking=by_case[key(e)].grad_ranking) if key(e) in by_case else e
              for e in suite_entries]
    measured = {key(e) for e in suite_entries}
    return merged + [e for e in headlines if key(e) not in measured]


def write_table(out_dir, env: dict) -> None:
    """dispatch.json from every suite case of suite.csv and the headline cases of bench.csv
    (with_headlines)."""
    entries = with_headlines(table_entries(results.read_rows(out_dir / "suite.csv")),
                             headline_entries(results.read_rows(out_dir / "bench.csv")))
    dispatch_table.write(out_dir / dispatch_table.TABLE_NAME, env["gpu"], env["git_sha"], entries)
    dispatch_table.forget()
    calls.forget()  # choices cached under the old table


def suite_layout(op: str, shape: tuple, dtype: str) -> str:
    """The layout class of the inputs make_inputs gives for a suite case (fresh, contiguous), read
    off meta tensors of the same shapes (no memory; their address reads as 0, as aligned as torch's
    own allocations)."""
    return dispatch_table.layout_class(SPECS[op].forward.make_inputs(shape, getattr(torch, dtype), "meta", None))


def calls_per_round(fn) -> int:
    """Calls of fn that fill one round (EAGER_MIN_MS / EAGER_ROUNDS), after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = (time.perf_counter() - start) * 1e3
    return int(min(EAGER_MAX_CALLS, max(10, EAGER_MIN_MS / EAGER_ROUNDS / max(one, 1e-3))))


def eager_in_turns(fns: list) -> list:
    """Each fn's time per call (ms) as a user's loop sees it (host cost and kernel together, the GPU
    queue overlapping them), or the exception it raised: EAGER_ROUNDS rounds in turns, the median
    round (timing.host_in_turns says why). With one long loop per caller, torch's own bf16
    64 x 16384 x 64 call measured 15.7 us in one H100 run and 90.6 in another."""
    counts = []
    for fn in fns:
        try:
            counts.append(calls_per_round(fn))
        except Exception as exc:  # reported in the table, not fatal to the suite
            counts.append(exc)
    timed = [i for i, c in enumerate(counts) if isinstance(c, int)]
    seconds = dict(zip(timed, timing.host_in_turns([fns[i] for i in timed], [counts[i] for i in timed], EAGER_ROUNDS)))
    return [c if isinstance(c, Exception) else seconds[i] * 1e3 for i, c in enumerate(counts)]


def eager_rows(group: suite.Group, gen, sha: str, backends=rosetta.BACKENDS) -> list[dict]:
    """torch's call and each backend's public call (step=None, the table in force), eager."""
    d = SPECS[group.op].forward
    inputs = d.make_inputs(group.shape, group.dtype, "cuda", gen)
    public = getattr(rosetta, group.op)
    callers = [("torch", 0, lambda: d.torch_expr(*inputs))]
    for backend in backends:
        try:
            step = rosetta.best(group.op, backend, group.dtype, inputs).step
        except ValueError:  # no step of this backend takes the dtype
            continue
        callers.append((backend, step, lambda b=backend: public(*inputs, backend=b)))
    rows = []
    for (backend, step, _), measured in zip(callers, eager_in_turns([fn for _, _, fn in callers])):
        row = dict.fromkeys(results.COLUMNS)
        row.update(op=group.op, direction="forward", backend=backend, step=step, name="call",
                   label=f"{group.op}/{backend}/call", dtype=str(group.dtype).removeprefix("torch."),
                   shape=suite.shape_str(group.shape), role="suite-eager", layout="", git_sha=sha,
                   metric=SPECS[group.op].metric,
                   timing=f"eager calls (wall clock, no flush), median of {EAGER_ROUNDS} rounds in turns")
        if isinstance(measured, Exception):
            row.update(status=f"error: {type(measured).__name__}: {measured}".splitlines()[0][:200])
        else:
            row.update(status="ok", p50_ms=measured)
        rows.append(row)
    return rows


def kept_rows(old: list[dict], cases: set, backends) -> list[dict]:
    """The rows of suite.csv a run of `cases` (op, dtype, shape) on `backends` keeps: every other
    case's, and of these cases the other backend's rows with the torch rows of their run, the
    reference their ratios are taken against (suite_report.cases)."""
    def case(r):
        return r["op"], r["dtype"], r["shape"]

    other_runs = {(*case(r), r["role"], r["git_sha"]) for r in old
                  if r["backend"] in rosetta.BACKENDS and r["backend"] not in backends}
    return [r for r in old if case(r) not in cases or r["backend"] not in ("torch", *backends)
            or (r["backend"] == "torch" and (*case(r), r["role"], r["git_sha"]) in other_runs)]


def run(ops, gen, limits, flush, env: dict, out_dir, dtypes=None, backend=None) -> list[dict]:
    """Time the cases of `ops` (of `dtypes`, if given; the steps of `backend` only, if given, beside
    torch) and rewrite suite.csv with them, keeping the rows of every other case and backend
    (written after each case: an interrupted run keeps what it measured); then the dispatch table
    from all of suite.csv, then the eager calls under that table."""
    backends = (backend,) if backend else rosetta.BACKENDS
    groups = plan(ops, dtypes)
    per_group = {g: [s for s in subjects(g.op, g.dtype, backends) if suite.takes(s, g)] for g in groups}
    progress = suite.Progress(sum(len(s) for s in per_group.values()))
    path = out_dir / "suite.csv"
    mine = {(g.op, str(g.dtype).removeprefix("torch."), suite.shape_str(g.shape)) for g in groups}
    kept = kept_rows(results.read_rows(path), mine, backends)
    rows = []
    for group, subs in per_group.items():
        rows += suite.run_group(group, subs, gen, limits, flush, progress, env["git_sha"])
        results.write_rows(path, kept + rows, replace_all=True)
        torch.cuda.empty_cache()
    write_table(out_dir, env)
    print(f"wrote {dispatch_table.TABLE_NAME}; timing the public calls eagerly", flush=True)
    for group in groups:
        rows += eager_rows(group, gen, env["git_sha"], backends)
        torch.cuda.empty_cache()
    results.write_rows(path, kept + rows, replace_all=True)
    return rows
