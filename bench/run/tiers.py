"""The reference tiers beside every ladder: torch eager (the vendor library path), torch.compile
(Inductor-generated Triton), torch unfused (the op as separate torch ops, where its spec writes
one out), CUDA-library tiers built into the extension (e.g. CUB), peer libraries when they import
(Liger-Kernel), and ablations (one of our steps launched with one choice changed). They quack like
a Variant for the bench."""
from __future__ import annotations

from dataclasses import dataclass

import torch

import rosetta
from rosetta.ops import SPECS

from . import peers

from ..tier_names import ABLATION, LIBRARY_TIERS, PEERS, TORCH_TIERS


@dataclass(frozen=True)
class Ablation:
    """A ladder step launched with one keyword of its launch() changed: what that one choice is
    worth, measured on the step's own kernel with everything else as the step has it."""
    op: str
    backend: str
    step: int
    keyword: str
    value: int

    @property
    def name(self) -> str:
        return f"{self.backend}_{self.step:02d}_{self.keyword}{self.value}"

    @property
    def variant(self):
        return rosetta.select(self.op, self.backend, self.step)


# The Triton tutorials warn that a tiny BLOCK_SIZE (4) makes vector_add ~95x slower than a tuned
# one: step 1's kernel at block=4 measures it (the site's claims page, bench/docs/claims.py, reads it).
ABLATIONS = (Ablation("vector_add", "triton", 1, "block", 4),)


@dataclass(frozen=True)
class Tier:
    op: str
    name: str  # a TORCH_TIERS name, a library tier's name, a peer's op name or an Ablation.name
    backend: str = "torch"
    step: int = 0
    ablation: Ablation | None = None  # set for the ablation tiers only

    @property
    def label(self) -> str:
        return f"{self.op}/{self.backend}/{self.name}"

    @property
    def dtypes(self):
        return self.ablation.variant.dtypes if self.ablation else SPECS[self.op].dtypes

    def takes(self, direction: str) -> bool:
        if self.backend in LIBRARY_TIERS or self.ablation:  # the override is for launch(), the forward
            return direction == "forward"
        if self.backend in PEERS:
            return peers.takes(self.backend, self.op, direction)
        d = SPECS[self.op].directions()[direction]
        if self.name == "unfused":
            return d.torch_unfused is not None
        if self.name not in TORCH_TIERS:  # a spec's own tier or baseline
            return self.name in d.more_tiers or self.name in d.baselines
        return True

    def is_baseline(self, direction: str) -> bool:
        return self.backend == "torch" and self.name in SPECS[self.op].directions()[direction].baselines


def tiers(op: str) -> list[Tier]:
    spec = SPECS[op]
    own = dict.fromkeys(name for d in spec.directions().values() for name in (*d.more_tiers, *d.baselines))
    torch_tiers = [Tier(op, name) for name in (*TORCH_TIERS, *own)]
    return ([t for t in torch_tiers if any(t.takes(d) for d in spec.directions())]
            + [Tier(op, LIBRARY_TIERS[lib], backend=lib) for lib in spec.tiers]
            + [Tier(op, op, backend=peer) for peer in spec.peers]
            + [Tier(op, a.name, backend=ABLATION, ablation=a) for a in ABLATIONS if a.op == op])


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


def runner(subject, direction: str, inputs: tuple, out, shape=None):
    """(fn, copied): fn() runs `subject` once and returns its output; copied names the inputs the
    step's layout made the dispatcher copy (before any timing). Steps, ablations and the eager,
    unfused and library tiers write into the preallocated `out` (unfused allocates its temporaries:
    that is its point); torch.compile and peers allocate their own."""
    d = SPECS[subject.op].directions()[direction]
    extra = d.extra_args(shape) if shape is not None else ()
    if not isinstance(subject, Tier):
        launch, copied = subject.launcher(direction, inputs, out, params=d.params_for(shape) if shape else None)
        return (lambda: (launch(), out)[1]), copied
    if subject.ablation:  # the step's own launch, one keyword changed
        a = subject.ablation
        launch, copied = a.variant.launcher(direction, inputs, out, **{a.keyword: a.value})
        return (lambda: (launch(), out)[1]), copied
    if subject.backend in LIBRARY_TIERS:  # built into the CUDA extension beside the steps
        from rosetta import cuda_build

        op = getattr(cuda_build.load(), f"{subject.op}_{subject.backend}_out")
        return (lambda: (op(*inputs, out), out)[1]), []
    if subject.backend in PEERS:
        return peers.runner(subject.backend, subject.op, direction, inputs), []
    if subject.name != "compile":  # into out, or (no out= variant) a result of its own
        fn = {"eager": d.torch_eager, "unfused": d.torch_unfused, **d.more_tiers, **d.baselines}[subject.name]

        def run():
            result = fn(*inputs, out, *extra)
            return out if result is None else result
        return run, []
    fn = compiled(subject.op, direction)
    return (lambda: fn(*inputs, *extra)), []
