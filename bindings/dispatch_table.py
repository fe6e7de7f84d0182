"""The measured dispatch table: which step is fastest for a shape class, per op, backend and dtype.

`python -m rosetta.bench --suite` times every step on the shapes users bring (each op spec's
`suite`) and writes results/<gpu>/dispatch.json: per measured case, the steps that were right, in
order of their median time. An op with no suite measured yet is ranked at its headline shapes
(bench.csv: every step is timed there), so step=None runs its fastest step, not its last; an op
with a suite has its headline shapes beside it (those the suite lacks, and the forward + backward
ranking the suite does not time). A call
is matched to the measured case nearest to it — the same input layout class where one was measured, then the smallest distance in log2 of each dimension of the
problem (softmax: rows, row length; matmul: M, K, N) — so a shape between measured points takes
the choice of its neighbour. From that case's ranking the first step whose declared limits the
call fits is used. This module reads the table; the bench writes it. Records only: choosing
between a table answer and the no-table rule is registry.decide's job.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .ops import SPECS
from .ops.spec import address, dtype_label
from .steps import REPO

TABLE_NAME = "dispatch.json"
RESULTS = REPO / "results"


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3': one results folder per GPU model."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def layout_class(inputs: tuple) -> str:
    """One letter pair per tensor input: its majorness (r: unit last stride, c: column-major 2-D,
    x: other strides) and whether its rows and start sit on 16-byte boundaries (a: aligned, u: not),
    which is what the vectorized and TMA steps care about."""
    parts = []
    for t in inputs:
        if t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) != 1:
            major, pitch = "c", t.stride(-1)
        elif t.dim() == 0 or t.stride(-1) == 1:
            major, pitch = "r", t.stride(-2) if t.dim() >= 2 else 0
        else:
            major, pitch = "x", 1
        aligned = (pitch * t.element_size()) % 16 == 0 and address(t) % 16 == 0
        parts.append(major + ("a" if aligned else "u"))
    return "".join(parts)


def distance(a: tuple, b: tuple) -> float:
    """How far apart two problem shapes are: the sum over dimensions of |log2 a - log2 b|."""
    if len(a) != len(b):
        return math.inf
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b))


@dataclass(frozen=True)
class Entry:
    """One measured case: the problem shape, the inputs' layout class, and the steps that were
    right there, fastest first, with their median times (ms)."""
    op: str
    backend: str
    dtype: str
    shape: tuple
    layout: str
    ranking: tuple  # ((step, p50_ms), ...): the forward
    source: str = "suite"  # or "headline": ranked at one of the op's headline shapes (bench.csv)
    run: str = ""  # the git sha of the run that measured it, where not the table's
    # ((step, forward + backward p50_ms), ...) where both directions were timed: the ranking of a
    # call with a gradient to take, which runs the chosen step's backward too (a step can win the
    # forward and lose the pair: the norms' split-row steps)
    grad_ranking: tuple = ()

    def to_json(self) -> dict:
        extra = {"source": self.source, "run": self.run} if self.source != "suite" else {}
        if self.grad_ranking:
            extra["grad_ranking"] = [list(r) for r in self.grad_ranking]
        return {"op": self.op, "backend": self.backend, "dtype": self.dtype, "shape": list(self.shape),
                "layout": self.layout, "ranking": [list(r) for r in self.ranking], **extra}

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        def pairs(key):
            return tuple((int(s), float(ms)) for s, ms in d.get(key, ()))
        return cls(d["op"], d["backend"], d["dtype"], tuple(d["shape"]), d["layout"], pairs("ranking"),
                   d.get("source", "suite"), d.get("run", ""), pairs("grad_ranking"))


@dataclass(frozen=True, eq=False)  # hashed by identity: nearest_case's cache keys on it
class Table:
    gpu: str
    git_sha: str
    entries: tuple[Entry, ...]

    def nearest(self, op: str, backend: str, dtype, inputs: tuple) -> tuple[Entry, float, bool] | None:
        """(entry, distance, same layout class) of the measured case nearest to the call, or None
        when nothing was measured for this op, backend and dtype."""
        return self.nearest_case(op, backend, dtype_label(dtype), SPECS[op].problem_shape(*inputs),
                                 layout_class(inputs))

    @functools.lru_cache(maxsize=4096)  # a new call signature looks its class up once
    def nearest_case(self, op: str, backend: str, dtype: str, shape: tuple, cls: str):
        mine = [e for e in self.entries if e.op == op and e.backend == backend and e.dtype == dtype]
        if not mine:
            return None
        same = [e for e in mine if e.layout == cls]
        best = min(same or mine, key=lambda e: distance(e.shape, shape))
        return best, distance(best.shape, shape), bool(same)


def write(path: Path, gpu: str, git_sha: str, entries: list[Entry]) -> None:
    path.write_text(json.dumps({"gpu": gpu, "git_sha": git_sha, "entries": [e.to_json() for e in entries]},
                               indent=1) + "\n")


def read(path: Path) -> Table | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return Table(data["gpu"], data.get("git_sha", ""), tuple(Entry.from_json(e) for e in data["entries"]))


_TABLES: dict = {}


def for_device(device: torch.device) -> Table | None:
    """The committed table of this GPU model (read once per device), or None: a CPU tensor, no
    CUDA, an installed wheel without results/, or a GPU nobody has measured."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _TABLES:
        _TABLES[index] = read(RESULTS / gpu_slug(torch.cuda.get_device_name(index)) / TABLE_NAME)
    return _TABLES[index]


def forget() -> None:
    """Drop the tables read so far (the bench rereads the one it has just written)."""
    _TABLES.clear()
