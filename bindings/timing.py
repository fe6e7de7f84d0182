"""How every number in this project is timed: one call captured as a CUDA graph, its replays timed
with CUDA events, the L2 flushed *cleanly* before each replay; median and p20/p80.

Why a clean flush: triton.testing.do_bench flushes by zeroing a 256 MB buffer, which leaves ~50 MB
of dirty lines in L2; their write-back to DRAM then runs inside the next timed kernel (~10 us on
the H100: torch.sum fp32 2^28 read 2,971 GB/s after a zeroing flush, 3,051 after a read-only one).
Reading a buffer of 4x the L2 instead evicts the lines, and the dirty ones are written back during
the flush, which is not timed. It reads the buffer twice: one pass does not evict every line. Lines
loaded with an evict_last hint outlive a single 256 MB pass (torch.compile's softmax backward loads
its rows so): on the H100, torch.sum over 64 MB that torch.compile's kernel had just read took
30.1 us after one pass and 31.0 (as a never-read buffer does) after two. On softmax fp32 4096 x
4096 backward, Liger's and CUDA step 5's kernels took 61.4-61.8 us after one pass that followed
torch.compile's kernel (or, in some runs, their own) and 62.4-63.8 after one that followed other
kernels: which subject ran before moved the next one by 3%. After two passes each took the same
time whatever ran before (63.3-63.7 us; torch.compile's 63.1), and so after one pass of a 1 GB
buffer. `sustained` is the third view: many back-to-back calls on rotating inputs, where nothing
is flushed at all.

Used by the bench and the hardware survey alike (both import this; it imports neither).
"""
from __future__ import annotations

import random
import statistics
import time

import torch

FLUSH_MODES = ("read", "zero")


class Flush:
    """Evicts the L2 before a timed replay. "read": sum a buffer of >= 4x the L2, twice (clean:
    leaves no dirty lines, and no evict_last line survives two passes); "zero": overwrite it, as
    do_bench does (kept to show what it costs)."""

    READ_PASSES = 2

    def __init__(self, mode: str = "read", device=None):
        if mode not in FLUSH_MODES:
            raise ValueError(f"flush mode {mode!r}; expected one of {FLUSH_MODES}")
        device = torch.device(device or torch.cuda.current_device())
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        nbytes = max(256 * 2**20, 4 * l2)
        self.mode = mode
        self.buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        self.sink = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        if self.mode == "read":
            for _ in range(self.READ_PASSES):
                torch.sum(self.buffer, dim=0, out=self.sink)
        else:
            self.buffer.zero_()


def capture(fn) -> torch.cuda.CUDAGraph:
    """One call of fn as a CUDA graph, warmed first (as capture requires) on a side stream: the
    one the capture then runs on, so that what a launch keeps per stream (Triton matmul step 9's
    counters, triton_launch.tickets) is made by the warm-up, not inside the graph."""
    graph = torch.cuda.CUDAGraph()
    context = torch.cuda.graph(graph)
    side = context.capture_stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with context:
        fn()
    return graph


def time_calls(call, flush: Flush | None, warmup_ms: float = 25, rep_ms: float = 100,
               min_reps: int = 5, max_reps: int = 1000) -> dict:
    """Median and p20/p80 (ms) of `call`, each timed alone between two events after a flush."""
    return summarize(replay_times(call, flush, warmup_ms, rep_ms, min_reps, max_reps))


def replay_times(call, flush: Flush | None, warmup_ms: float = 25, rep_ms: float = 100,
                 min_reps: int = 5, max_reps: int = 1000, estimate_ms: float | None = None) -> list[float]:
    """The times (ms) of about rep_ms worth of calls, each between two events after a flush,
    once about warmup_ms of calls have run. estimate_ms: one flush + call, if already known."""
    Event = torch.cuda.Event
    flush = flush or (lambda: None)
    if estimate_ms is None:
        estimate_ms = estimate(call, flush)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        flush()
        call()
    reps = min(max_reps, max(min_reps, int(rep_ms / estimate_ms)))
    starts = [Event(enable_timing=True) for _ in range(reps)]
    ends = [Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush()
        s.record()
        call()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def estimate(call, flush: Flush | None) -> float:
    """One flush + call (ms), from three of them after a first call (a fresh graph's first replay
    is slower: it is kept out of the estimate)."""
    flush = flush or (lambda: None)
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        flush()
        call()
    end.record()
    torch.cuda.synchronize()
    return max(start.elapsed_time(end) / 3, 1e-3)


def summarize(times: list[float]) -> dict:
    times = sorted(times)
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return {"p50_ms": statistics.median(times), "p20_ms": q[1], "p80_ms": q[7], "reps": len(times)}


def graph_or_calls(fn):
    """(replay, how): fn as the replay of a one-call CUDA graph (the host's launch path, tens of us
    for an autotuned Triton launch, stays out); a step that cannot be captured is timed call by call."""
    try:
        return capture(fn).replay, "graph"
    except Exception as exc:  # some launch path cannot be captured
        return fn, f"events (graph capture failed: {type(exc).__name__})"


def measure(fn, flush: Flush | None) -> dict:
    """fn's time, as graph_or_calls replays it."""
    replay, how = graph_or_calls(fn)
    return {**time_calls(replay, flush), "timing": how}


ROUNDS = 16  # measure_in_turns' rounds: each subject's warm-up and reps split this many ways


def measure_in_turns(subjects: list, flush: Flush | None, rounds: int = ROUNDS, seed: int = 0) -> list[dict]:
    """Each subject's time, measured in turns: `rounds` rounds, each timing every subject for
    1 / rounds of measure's warm-up and reps, their times pooled. For ratios between calls (tiers
    and steps on one shape, one input layout against another): the GPU's clock drifts as it heats
    over seconds (several percent on an 8192^3 matmul), and in turns every call sees the same
    drift, where one after the other each sees its own part of it. Every round visits the subjects
    in a new order (shuffled, seeded), so that no subject always follows the same one: with a
    one-pass flush, what ran just before a call moved it (softmax fp32 4096 x 4096 backward: the
    same kernel took 61.8 us after torch's kernels and 64.0 after steps 2-4's; Liger, listed after
    the torch tiers, won by that margin), because lines a neighbour loaded with evict_last
    outlived the flush (Flush says how; its two passes remove that).
    A subject is a list of calls that do the same work into outputs of their own ("placements",
    each its own graph); round r times placement r % len. Where an output lands moves a short
    kernel: softmax fp32 4096 x 1024 forward, the same kernel on four output buffers took 13.09 to
    13.34 us, as far apart as the steps and tiers being ranked. Rotating averages that out.
    A subject's timed calls cost what measure's do; each placement adds one capture. The cost
    estimate is taken once, on the first placement: the others do the same work."""
    replays = [[graph_or_calls(call) for call in calls] for calls in subjects]
    estimates = [estimate(placements[0][0], flush) for placements in replays]
    times = [[] for _ in subjects]
    order, shuffle = list(range(len(subjects))), random.Random(seed).shuffle
    for r in range(rounds):  # measure's warm-up and reps spread over the rounds: the same GPU time
        shuffle(order)
        for i in order:
            p = r % len(replays[i])
            times[i] += replay_times(replays[i][p][0], flush, warmup_ms=25 / rounds, rep_ms=100 / rounds,
                                     min_reps=2, estimate_ms=estimates[i])
    return [{**summarize(t), "timing": placements[0][1]} for t, placements in zip(times, replays)]


def sustained(make_call, copies: int = 8, calls: int = 64) -> dict:
    """Back-to-back calls with no flush at all: `make_call(i)` returns a call on the i-th of
    `copies` input sets (rotating, so no input is L2-resident when it is read again); `calls`
    calls are captured in one graph and the graph's time is divided by `calls`."""
    fns = [make_call(i) for i in range(copies)]
    graph = capture(lambda: [fns[i % copies]() for i in range(calls)])
    timing = time_calls(graph.replay, None, rep_ms=200)
    return {k: (v / calls if k.endswith("_ms") else v) for k, v in timing.items()} | {"timing": "sustained"}


def host_in_turns(fns: list, counts: list[int], rounds: int) -> list[float]:
    """Host wall time per call (seconds) of each fn: `rounds` rounds, fn i making counts[i] calls in
    a loop once a round, every fn in turns, the GPU synchronised after each loop, and the median
    round. For calls timed as the host sees them (a user's eager loop, a call's host cost): the
    host's speed moves from second to second (other processes, garbage collections), so callers
    timed one after another each see their own part of that drift; in turns they share each round,
    and the median drops a round that stalled."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, count, mine in zip(fns, counts, times):
            start = time.perf_counter()
            for _ in range(count):
                fn()
            torch.cuda.synchronize()
            mine.append((time.perf_counter() - start) / count)
    return [statistics.median(t) for t in times]
