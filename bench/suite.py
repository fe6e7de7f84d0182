"""Run the bench: for every (op, dtype, shape) make fresh inputs and the fp64 reference once, then
for every reference tier and step: check correctness, and time it only if it is right."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

import rosetta
from rosetta.ops import SPECS

from . import lines, nvtx, results
from .tiers import Tier, runner, tiers

TIMING_METHOD = ("one call captured as a CUDA graph, its replay timed by triton.testing.do_bench: "
                 "CUDA events around each replay, a 256 MB L2 flush before every replay; median and "
                 "p20/p80; warm-up, JIT and autotuning run before capture; outputs preallocated "
                 "(torch.compile allocates its own, from the graph's pool). The graph keeps the host's "
                 "Python launch path (tens of us for an autotuned Triton launch) out of the time; a "
                 "step that cannot be captured is timed per call (timing = events)")


@dataclass(frozen=True)
class Group:
    """One set of inputs shared by every subject measured on it."""
    op: str
    dtype: torch.dtype
    shape: tuple
    role: str  # "headline" (the ladder table) or "sweep" (throughput vs size)


def plan(ops, quick: bool) -> list[Group]:
    groups = []
    for op in ops:
        spec = SPECS[op]
        dtypes = spec.dtypes[:1] if quick else spec.dtypes
        groups += [Group(op, d, spec.headline, "headline") for d in dtypes]
        if not quick:
            groups += [Group(op, spec.dtypes[0], s, "sweep") for s in spec.sweep if s != spec.headline]
    return groups


def subjects(op, backend=None, step=None) -> list:
    found = [] if backend not in (None, "torch") else tiers(op)
    if backend != "torch":
        found += [v for v in rosetta.variants(op, backend) if step is None or v.step == step]
    return found


def shape_str(shape) -> str:
    return "x".join(str(s) for s in shape)


class Progress:
    """One line per measurement: [done/total elapsed] label dtype shape -> result."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.monotonic()

    def report(self, label: str, text: str) -> None:
        self.done += 1
        elapsed = int(time.monotonic() - self.start)
        print(f"[{self.done:4d}/{self.total} {elapsed // 60:2d}:{elapsed % 60:02d}] {label:42s} {text}",
              flush=True)


def measure(fn) -> tuple[float, float, float, str]:
    """(p50, p20, p80 in ms, how): the replay of a one-call CUDA graph, else events per call."""
    from triton.testing import do_bench

    try:
        replay, how = capture(fn).replay, "graph"
    except Exception as exc:  # some launch path cannot be captured: time it call by call
        replay, how = fn, f"events (graph capture failed: {type(exc).__name__})"
    p50, p20, p80 = do_bench(replay, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
    return p50, p20, p80, how


def capture(fn) -> torch.cuda.CUDAGraph:
    """One call of fn as a CUDA graph (warmed on a side stream first, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def run_group(group: Group, subjects_: list, gen, ceilings: dict, progress: Progress, sha: str) -> list[dict]:
    spec = SPECS[group.op]
    inputs = spec.make_inputs(group.shape, group.dtype, "cuda", gen)
    reference = spec.reference(*inputs)
    tolerance = spec.tolerance[group.dtype]
    dtype_name = str(group.dtype).removeprefix("torch.")
    ceiling = ceilings.get(spec.ceiling)
    if isinstance(ceiling, dict):  # tensor ceilings are per dtype
        ceiling = ceiling.get(dtype_name)
    rows = []
    for subject in subjects_:
        if group.dtype not in subject.dtypes:
            continue
        out = spec.allocate(*inputs)
        if out.is_floating_point():
            out.fill_(float("nan"))  # every element must be written
        fn = runner(subject, inputs, out)

        def launch(fn=fn, label=subject.label):
            with nvtx.step_range(label):
                return fn()

        row = base_row(subject, group, dtype_name, sha)
        try:
            result = launch()  # also the warm-up: JIT compile, autotune, torch.compile
            torch.cuda.synchronize()
            err = spec.relative_error(result, reference, inputs)
        except Exception as exc:  # a broken step is reported, not fatal to the suite
            row.update(status=f"error: {type(exc).__name__}: {exc}".splitlines()[0][:200])
            progress.report(subject.label, f"{dtype_name} {shape_str(group.shape)}: {row['status']}")
            rows.append(row)
            continue
        row["rel_error"] = err
        if not err <= tolerance:
            row["status"] = "wrong"
            progress.report(subject.label, f"{dtype_name} {shape_str(group.shape)}: WRONG "
                                           f"(rel. error {err:.3g} > {tolerance:g}), not timed")
        else:
            p50, p20, p80, how = measure(launch)
            work = spec.minimal_bytes(group.shape, group.dtype) if spec.metric == "GB/s" \
                else spec.flops(group.shape)
            scale = 1e9 if spec.metric == "GB/s" else 1e12
            row.update(status="ok", p50_ms=p50, p20_ms=p20, p80_ms=p80, timing=how,
                       throughput=work / (p50 * 1e-3) / scale)
            if ceiling:
                row["pct_of_ceiling"] = 100 * row["throughput"] / ceiling
            progress.report(subject.label, f"{dtype_name} {shape_str(group.shape)}: {p50 * 1e3:9.1f} us "
                                           f"{row['throughput']:8.1f} {spec.metric} ({how})")
        rows.append(row)
        del out, result
    add_speedups(rows)
    return rows


def base_row(subject, group: Group, dtype_name: str, sha: str) -> dict:
    row = dict.fromkeys(results.COLUMNS)  # every column present, measured or not
    row.update(op=group.op, backend=subject.backend, step=subject.step, name=subject.name,
               label=subject.label, dtype=dtype_name, shape=shape_str(group.shape),
               numel=math.prod(group.shape), role=group.role, metric=SPECS[group.op].metric, git_sha=sha)
    if not isinstance(subject, Tier):
        count = lines.count(rosetta.registry.REPO / subject.source)
        row.update(device_nloc=count.device_nloc, device_tokens=count.device_tokens,
                   host_nloc=count.host_nloc)
    return row


def add_speedups(rows: list[dict]) -> None:
    """Throughput over torch eager's, measured on the same inputs in the same run."""
    eager = next((r for r in rows if r["backend"] == "torch" and r["name"] == "eager"
                  and r.get("throughput")), None)
    for row in rows:
        if eager and row.get("throughput"):
            row["speedup_vs_torch"] = row["throughput"] / eager["throughput"]
