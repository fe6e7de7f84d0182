"""The reference tiers beside every ladder: torch eager (the vendor library path), torch.compile
(Inductor-generated Triton), CUDA-library tiers built into the extension (e.g. CUB), and peer
libraries when they import (Liger-Kernel). They quack like a Variant for the bench."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rosetta.ops import SPECS

from . import peers

TORCH_TIERS = ("eager", "compile")
LIBRARY_TIERS = {"cub": "device_reduce"}  # backend -> name: CUDA-library references
REFERENCE_BACKENDS = ("torch", *LIBRARY_TIERS, *peers.PEERS)


@dataclass(frozen=True)
class Tier:
    op: str
    name: str  # "eager", "compile", a library tier's name, or a peer's op name
    backend: str = "torch"
    step: int = 0

    @property
    def label(self) -> str:
        return f"{self.op}/{self.backend}/{self.name}"

    @property
    def dtypes(self):
        return SPECS[self.op].dtypes

    def takes(self, direction: str) -> bool:
        if self.backend in LIBRARY_TIERS:
            return direction == "forward"
        if self.backend in peers.PEERS:
            return peers.takes(self.backend, self.op, direction)
        return True


def tiers(op: str) -> list[Tier]:
    spec = SPECS[op]
    return ([Tier(op, name) for name in TORCH_TIERS]
            + [Tier(op, LIBRARY_TIERS[lib], backend=lib) for lib in spec.tiers]
            + [Tier(op, op, backend=peer) for peer in spec.peers])


_compiled = {}


def compiled(op: str, direction: str):
    """One torch.compile of the op's expression; dynamic=False so every shape gets its own kernel,
    as a static-shape user would."""
    if (op, direction) not in _compiled:
        dynamo = torch._dynamo.config
        for knob in ("recompile_limit", "cache_size_limit"):  # the sweeps have > 8 shapes x dtypes
            if hasattr(dynamo, knob):
                setattr(dynamo, knob, 256)
        _compiled[op, direction] = torch.compile(SPECS[op].directions()[direction].torch_expr, dynamic=False)
    return _compiled[op, direction]


def runner(subject, direction: str, inputs: tuple, out):
    """(fn, copied): fn() runs `subject` once and returns its output; copied names the inputs the
    step's layout made the dispatcher copy (before any timing). Steps and the eager and library
    tiers write into the preallocated `out`; torch.compile and peers allocate their own."""
    d = SPECS[subject.op].directions()[direction]
    if not isinstance(subject, Tier):
        launch, copied = subject.launcher(direction, inputs, out)
        return (lambda: (launch(), out)[1]), copied
    if subject.backend in LIBRARY_TIERS:  # built into the CUDA extension beside the steps
        from rosetta import cuda_build

        cuda_build.load()
        op = getattr(torch.ops.rosetta, f"{subject.op}_{subject.backend}_out")
        return (lambda: (op(*inputs, out), out)[1]), []
    if subject.backend in peers.PEERS:
        return peers.runner(subject.backend, subject.op, direction, inputs), []
    if subject.name == "eager":
        return (lambda: (d.torch_eager(*inputs, out), out)[1]), []
    fn = compiled(subject.op, direction)
    return (lambda: fn(*inputs)), []
