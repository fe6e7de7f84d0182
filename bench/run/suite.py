"""Run the bench: for every (op, direction, dtype, shape) make fresh inputs and the fp64 reference
once, then for every reference tier and step: check correctness, and time it only if it is right."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

import rosetta
from rosetta import timing
from rosetta.ops import SPECS
from rosetta.ops.spec import as_tuple

from .. import lines, results
from . import nvtx
from .tiers import Tier, runner, tiers

PLACEMENTS = 4  # outputs per subject, timed in rotation (rosetta.timing.measure_in_turns says why)
TIMING_METHOD = ("one call captured as a CUDA graph, its replays timed with CUDA events "
                 "(rosetta.timing); before every replay a clean L2 flush (two sums over a buffer of "
                 "4x the L2, which leave no dirty lines and no evict_last lines behind); median and "
                 "p20/p80; warm-up, JIT and autotuning run before capture; outputs preallocated "
                 "(torch.compile and peer libraries allocate their own, from the graph's pool); an "
                 "input a step's layout cannot take is copied before capture, reported, not timed; "
                 "the subjects of one (op, direction, dtype, shape), and every input layout, timed in "
                 f"turns (rosetta.timing.measure_in_turns: {timing.ROUNDS} rounds, each in a new seeded "
                 "shuffled order) so that their ratios see the same clock and no subject always follows "
                 f"the same one; each subject on {PLACEMENTS} outputs of its own (a graph each), one per "
                 "round in rotation, so that no subject's time rests on where one output landed (fewer "
                 "where the graphs' memory, outputs and temporaries, would not fit a quarter of the free "
                 "memory)")


@dataclass(frozen=True)
class Group:
    """One set of inputs shared by every subject measured on it."""
    op: str
    direction: str
    dtype: torch.dtype
    shape: tuple
    role: str  # "headline" (a ladder table), "layout" (other input layouts), "sweep" (vs size) or
    # "suite" (the shapes users bring: bench/run/shape_suite.py)
    layouts: tuple = ("",)  # the input layouts measured, in turns when more than one (see run_group)


def plan(ops, quick: bool) -> list[Group]:
    """Headline groups of every op x direction x (shape, dtype); then the other input layouts
    (forward); then the sweeps. --quick: the first headline shape in its first dtype, no more."""
    headlines, layouts, sweeps = [], [], []
    for op in ops:
        spec = SPECS[op]
        for direction in spec.directions():
            heads = spec.headlines[:1] if quick else spec.headlines
            for h in heads:
                headlines += [Group(op, direction, d, h.shape, "headline") for d in (h.dtypes[:1] if quick else h.dtypes)]
            if not quick:
                headline_keys = {(h.shape, d) for h in spec.headlines for d in h.dtypes}
                sweeps += [Group(op, direction, spec.sweep_dtype, s, "sweep") for s in spec.sweep
                           if (s, spec.sweep_dtype) not in headline_keys]
        if not quick:
            layouts += [Group(op, "forward", d, h.shape, "layout", (results.DEFAULT_LAYOUT, *spec.input_layouts))
                        for h in spec.layout_headlines for d in h.dtypes]
    return headlines + layouts + sweeps  # every ladder table first: the sweeps only add points to plots


def subjects(op, backend=None, step=None, role="headline", dtype=None, shape=None) -> list:
    """Tiers (torch eager alone where one backend is asked for), then the steps (all of them at a
    headline; in a sweep and in another input layout, where the only tier is the library's, torch
    eager, the step step=None runs for `shape` on this GPU, chosen on stand-in inputs of that shape)."""
    found = tiers(op)
    if role == "layout" or backend not in (None, "torch"):  # eager: the ratios' reference in this run
        found = [t for t in found if t.name == "eager"]
    if role == "sweep" and SPECS[op].sweep_tiers is not None:
        found = [t for t in found if t.name in SPECS[op].sweep_tiers]
    if backend != "torch":
        for b in ([backend] if backend else rosetta.BACKENDS):
            ladder = rosetta.variants(op, b)
            if role in ("sweep", "layout") and step is None and ladder:
                stand_ins = SPECS[op].forward.make_inputs(shape, dtype, "meta", None) if shape else ()
                ladder = ([rosetta.decide(op, b, dtype, stand_ins, device=torch.device("cuda")).variant]
                          if any(dtype in v.dtypes for v in ladder) else [])
            found += [v for v in ladder if step is None or v.step == step]
    return found


def shape_str(shape) -> str:
    return "x".join(str(s) for s in shape)


class Progress:
    """One line per measurement: [done/total elapsed] label direction dtype shape -> result."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.monotonic()

    def report(self, label: str, group: Group, text: str, layout: str = "") -> None:
        self.done += 1
        elapsed = int(time.monotonic() - self.start)
        what = f"{group.direction[:3]} {str(group.dtype).removeprefix('torch.')} {shape_str(group.shape)} {layout}".rstrip()
        print(f"[{self.done:4d}/{self.total} {elapsed // 60:2d}:{elapsed % 60:02d}] {label:40s} {what:32s} {text}",
              flush=True)


def takes(subject, group: Group) -> bool:
    return group.dtype in subject.dtypes and group.direction in SPECS[group.op].directions() \
        and (not isinstance(subject, Tier) or subject.takes(group.direction))


def call_ms(fn) -> float:
    """One call's time with events (after warm-up): decides whether a slow step is timed here."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


SUITE_SLOWER = 4.0  # in the suite, a step this many times its backend's fastest one is not timed


def run_group(group: Group, subjects_: list, gen, limits: dict, flush, progress: Progress, sha: str) -> list[dict]:
    """Every subject's rows on one set of inputs: one row per input layout of the group. The
    subjects and their layouts are timed in turns (timing.measure_in_turns), so their ratios see
    the same clock: timed one after the other, each saw its own moment of a GPU whose clock
    follows its temperature and power, and gaps of 1-2% between tiers came and went with the
    order. Every subject in a turn keeps its placements alive, each a graph that holds its output
    and the temporaries of its call (its own memory pool), so the subjects of a turn take at most
    a quarter of the free memory: a group whose calls take more is timed in several turns (long
    softmax rows: one each), and a call that alone takes more runs on fewer placements (the
    unfused attention formula's S x S scores: one)."""
    from ..ceilings import apply_to_rows

    spec = SPECS[group.op]
    d = spec.directions()[group.direction]
    inputs = d.make_inputs(group.shape, group.dtype, "cuda", gen)
    laid_out = {name: inputs if name in ("", results.DEFAULT_LAYOUT) else spec.input_layouts[name](*inputs)  # same values
                for name in group.layouts}
    reference = d.reference(*inputs, *d.extra_args(group.shape))
    gate = None
    if d.gate_inputs:  # a second data set the gate also checks (e.g. all-positive for a sum)
        gate_inputs = d.gate_inputs(group.shape, group.dtype, "cuda", gen)
        gate = (gate_inputs, d.reference(*gate_inputs))
    dtype_name = str(group.dtype).removeprefix("torch.")
    tolerance = d.tolerance[group.dtype]
    work = d.minimal_bytes(group.shape, group.dtype) if spec.metric == "GB/s" else d.flops(group.shape)
    scale = 1e9 if spec.metric == "GB/s" else 1e12
    out_bytes = sum(r.numel() * group.dtype.itemsize for r in as_tuple(reference))  # one call's outputs
    torch.cuda.empty_cache()  # the last group's graph pools, cached but unused
    budget = torch.cuda.mem_get_info()[0] // 4
    rows, turn = [], []  # turn: the (subject, row, launches, bytes) of right answers waiting to be timed
    fastest = {}  # backend -> its quickest replay so far in this group (the suite's slow-step cut)

    def time_turn():
        try:
            times = timing.measure_in_turns([launches for _, _, launches, _ in turn], flush)
        except torch.OutOfMemoryError:  # more than measured (an allocator's slack): one at a time,
            torch.cuda.empty_cache()  # then one placement
            if len(turn) > 1:
                waiting = turn[:]
                turn.clear()
                for entry in waiting:
                    turn.append(entry)
                    time_turn()
                return
            subject, row, launches, held = turn[0]
            if len(launches) > 1:
                turn[0] = (subject, row, launches[:1], held // len(launches))
                time_turn()
                return
            turn.pop()
            row["status"] = "error: out of memory while timed"
            progress.report(subject.label, group, row["status"], row["layout"])
            torch.cuda.empty_cache()
            return
        for (subject, row, _, _), t in zip(turn, times):
            row.update(status="ok", p50_ms=t["p50_ms"], p20_ms=t["p20_ms"], p80_ms=t["p80_ms"],
                       timing=t["timing"], throughput=work / (t["p50_ms"] * 1e-3) / scale)
            progress.report(subject.label, group, f"{t['p50_ms'] * 1e3:10.1f} us {row['throughput']:8.1f} "
                                                  f"{spec.metric} ({t['timing']})", row["layout"])
        turn.clear()

    for subject in subjects_:
        if not takes(subject, group):
            continue
        for name, x in laid_out.items():
            row = base_row(subject, group, dtype_name, sha)
            row["layout"] = name
            launch, call_bytes = check(subject, group, d, x, reference, gate, row, fastest)
            rows.append(row)
            if launch:  # right: the other placements are the same call into outputs of their own
                per_graph = out_bytes + call_bytes
                count = placements_that_fit(per_graph, budget)
                if turn and sum(entry[3] for entry in turn) + count * per_graph > budget:
                    time_turn()
                more = [placement(subject, group, d, x)[0] for _ in range(count - 1)]
                turn.append((subject, row, [launch, *more], count * per_graph))
            elif row["status"] == "wrong":
                progress.report(subject.label, group, f"WRONG (error {row['error']:.3g} > {tolerance:g}), not timed", name)
            else:
                progress.report(subject.label, group, row["status"], name)
    if turn:
        time_turn()
    add_speedups(rows)
    apply_to_rows(rows, limits, SPECS)
    return rows


def placements_that_fit(per_graph: int, budget: int) -> int:
    """How many placements of a call fit a turn's budget when each graph holds `per_graph` bytes
    (its output and its call's temporaries): PLACEMENTS, fewer for a large call, never none."""
    return max(1, min(PLACEMENTS, budget // max(per_graph, 1)))


def check(subject, group: Group, d, inputs: tuple, reference, gate, row: dict, fastest: dict | None = None):
    """(launch, temporaries): the subject's launch on `inputs` (direction `d` of the group's op)
    when its answer is right and it is to be timed, and the bytes one call allocates beyond its
    output; else (None, 0), with the row's status saying why (refused, error, wrong, or
    too slow for this shape: at a headline, two calls slower than the spec's slow_call_ms; in
    the suite, a step whose graph replay takes SUITE_SLOWER times its backend's fastest so far,
    `fastest`, which this updates: it cannot be the one step=None picks)."""
    tolerance = d.tolerance[group.dtype]
    try:
        launch, copied = placement(subject, group, d, inputs)
        row["input_copy"] = ",".join(copied)
        result = launch()  # also the warm-up: JIT compile, autotune, torch.compile
        torch.cuda.synchronize()
        baseline = isinstance(subject, Tier) and subject.is_baseline(group.direction)
        if baseline:  # part of the op, not the op: timed, never judged (no error in its row)
            err = 0.0
        else:
            err = (d.tier_error(inputs, result) if d.tier_error and isinstance(subject, Tier)
                   else d.error(result, reference, inputs))
        if gate and err <= tolerance:
            g_fn, _ = runner(subject, group.direction, gate[0], d.poisoned(*gate[0]), group.shape)
            err = max(err, d.error(g_fn(), gate[1], gate[0]))
        del result
    except ValueError as exc:  # the step (or a peer) declares it does not take this input
        row.update(status=f"refused: {exc}".splitlines()[0][:200])
        return None, 0
    except Exception as exc:  # a broken step is reported, not fatal to the suite
        row.update(status=f"error: {type(exc).__name__}: {exc}".splitlines()[0][:200])
        torch.cuda.synchronize()
        return None, 0
    row["error"] = None if baseline else err
    if not err <= tolerance:
        row["status"] = "wrong"
        return None, 0
    if group.role == "suite" and fastest is not None:
        # the kernel's own time, from a graph (a first call's event time also holds the host's
        # launch path: tens of us for an autotuned Triton launch, more than a small GEMM takes)
        replay, _ = timing.graph_or_calls(launch)
        one_call = timing.estimate(replay, None)
        best = fastest.get(subject.backend, math.inf)
        if one_call > SUITE_SLOWER * best:
            row["status"] = f"slow: {one_call / best:.0f}x the fastest {subject.backend} step here, not timed"
            return None, 0
        fastest[subject.backend] = min(best, one_call)
    else:
        one_call = call_ms(launch)
        if group.role == "headline" and one_call > SPECS[group.op].slow_call_ms:
            # once more before judging: FlexAttention at the first shape of a run read 255-343 ms
            # a call, and 1.1 ms at the next shape; a second call tells slow from still compiling
            one_call = min(one_call, call_ms(launch))
        if group.role == "headline" and one_call > SPECS[group.op].slow_call_ms:
            row["status"] = f"slow: {one_call:.0f} ms a call, timed at smaller shapes"
            return None, 0
    return launch, temporaries(launch)


def temporaries(launch) -> int:
    """Bytes one call allocates beyond the output it was given (a warm call: no compile or
    autotune): the memory its graph's pool will hold."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated()
    launch()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - held


def placement(subject, group: Group, d, inputs: tuple):
    """(launch, copied): one call of the subject on `inputs`, into an output of its own (NaN-filled:
    a step that skips an element cannot pass), inside the step's NVTX range."""
    fn, copied = runner(subject, group.direction, inputs, d.poisoned(*inputs), group.shape)

    def launch():
        with nvtx.step_range(subject.label):
            return fn()
    return launch, copied


def base_row(subject, group: Group, dtype_name: str, sha: str) -> dict:
    row = dict.fromkeys(results.COLUMNS)  # every column present, measured or not
    row.update(op=group.op, direction=group.direction, backend=subject.backend, step=subject.step,
               name=subject.name, label=subject.label, dtype=dtype_name, shape=shape_str(group.shape),
               numel=math.prod(group.shape), role=group.role, metric=SPECS[group.op].metric,
               git_sha=sha)
    if not isinstance(subject, Tier):
        count = lines.count(rosetta.registry.REPO / subject.source)
        row.update(device_nloc=count.device_nloc, device_tokens=count.device_tokens,
                   host_nloc=count.host_nloc)
    return row


def add_speedups(rows: list[dict]) -> None:
    """Throughput over torch eager's, measured on the same inputs (in the same layout) in the same run."""
    eager = {r["layout"]: r for r in rows if r["backend"] == "torch" and r["name"] == "eager" and r.get("throughput")}
    for row in rows:
        if row["layout"] in eager and row.get("throughput"):
            row["speedup_vs_torch"] = row["throughput"] / eager[row["layout"]]["throughput"]
