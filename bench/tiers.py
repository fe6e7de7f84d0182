"""The reference tiers beside every ladder: torch eager (the vendor library path) and
torch.compile (Inductor-generated Triton). They quack like a Variant for the bench."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rosetta.ops import SPECS

TORCH_TIERS = ("eager", "compile")
LIBRARY_TIERS = {"cub": "device_reduce"}  # backend -> name: CUDA-library references
REFERENCE_BACKENDS = ("torch", *LIBRARY_TIERS)


@dataclass(frozen=True)
class Tier:
    op: str
    name: str  # "eager", "compile", or a library tier's name
    backend: str = "torch"
    step: int = 0

    @property
    def label(self) -> str:
        return f"{self.op}/{self.backend}/{self.name}"

    @property
    def dtypes(self):
        return SPECS[self.op].dtypes


def tiers(op: str) -> list[Tier]:
    return [Tier(op, name) for name in TORCH_TIERS] + \
           [Tier(op, LIBRARY_TIERS[lib], backend=lib) for lib in SPECS[op].tiers]


_compiled = {}


def compiled(op: str):
    """One torch.compile of the op's expression; dynamic=False so every shape gets its own kernel,
    as a static-shape user would."""
    if op not in _compiled:
        dynamo = torch._dynamo.config
        for knob in ("recompile_limit", "cache_size_limit"):  # the sweep has > 8 shapes x dtypes
            if hasattr(dynamo, knob):
                setattr(dynamo, knob, 256)
        _compiled[op] = torch.compile(SPECS[op].torch_expr, dynamic=False)
    return _compiled[op]


def runner(subject, inputs, out):
    """A zero-argument callable that runs `subject` once and returns its output. Steps and the
    eager tier write into the preallocated `out`; torch.compile allocates its own output (from
    the caching allocator: no cudaMalloc in the timed region)."""
    if isinstance(subject, Tier):
        spec = SPECS[subject.op]
        if subject.backend == "cub":  # built into the CUDA extension beside the steps
            from rosetta import dispatch

            dispatch.ensure_loaded("cuda")
            op = getattr(torch.ops.rosetta, f"{subject.op}_{subject.backend}_out")
            return lambda: (op(*inputs, out), out)[1]
        if subject.name == "eager":
            return lambda: (spec.torch_eager(*inputs, out), out)[1]
        fn = compiled(subject.op)
        return lambda: fn(*inputs)
    return lambda: subject.launch_into(*inputs, out=out)
