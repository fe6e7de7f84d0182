"""The one registry: every discovered step as a Variant, the public handle that runs it.

Steps are found by bindings/steps.py; this module only adds the call paths (through dispatch) and
the lookups: variants(), best(), select(). Tests, bench, line counts, ncu runs and KERNEL_LOG
tables all iterate variants().
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from . import dispatch
from .ops import OPS
from .steps import BACKENDS, REPO, Header, RegistryError, Step, all_steps

__all__ = ["OPS", "BACKENDS", "REPO", "Header", "RegistryError", "Variant", "variants", "best",
           "select", "ops_with_steps"]


@dataclass(frozen=True, eq=False, repr=False)
class Variant(Step):
    def __call__(self, *inputs):
        """Run this step (forward): checked inputs, the registered torch op, a new output."""
        return dispatch.run(self, "forward", inputs)

    def backward(self, *inputs):
        """Run this step's backward kernel (softmax: y, dy -> dx)."""
        return dispatch.run(self, "backward", inputs)

    def launch_into(self, *inputs, out, direction: str = "forward"):
        """Launch into a preallocated `out` (no allocation: what the bench times)."""
        self.launcher(direction, inputs, out)[0]()
        return out

    def launcher(self, direction: str, inputs: tuple, out, **overrides):
        """(launch, copied): checks and layout copies now, then launch() runs only the kernel.
        `overrides`: keyword arguments for a Triton step's launch() (a bench ablation tier)."""
        return dispatch.launcher(self, direction, inputs, out, **overrides)


_REGISTRY: tuple[Variant, ...] | None = None


def _all_variants() -> tuple[Variant, ...]:
    """Discovered once, then a plain global read: torch.compile traces rosetta.softmax & co.
    through here, and must see a constant, not file reads."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = tuple(Variant(**{f.name: getattr(s, f.name) for f in fields(s)}) for s in all_steps())
    return _REGISTRY


def variants(op: str | None = None, backend: str | None = None) -> list[Variant]:
    """Every registered step, in (op, backend, step) order, optionally filtered."""
    if op is not None and op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    return [v for v in _all_variants()
            if (op is None or v.op == op) and (backend is None or v.backend == backend)]


def ops_with_steps() -> list[str]:
    """The ops that have at least one step file, in OPS order."""
    return [op for op in OPS if variants(op)]


def best(op: str, backend: str, dtype=None, inputs: tuple = ()) -> Variant:
    """The step used when step=None: the last (most optimized) one that takes `dtype` and, given
    `inputs`, whose declared limits they fit (a TMA step passes an fp16 K of 33 to the last step
    that takes it; with no step left, the last one that takes `dtype` says why it refuses).
    A step with a declared hazard (a known way to go wrong) is run only when asked for by number."""
    ladder = variants(op, backend)
    if not ladder:
        raise ValueError(f"{op} has no {backend} steps yet")
    ladder = [v for v in ladder if not v.hazard] or ladder
    if dtype is None:
        return ladder[-1]
    taking = [v for v in ladder if dtype in v.dtypes]
    if not taking:
        raise ValueError(f"no {op}/{backend} step takes {dtype}; the steps take "
                         f"{sorted({str(d) for v in ladder for d in v.dtypes})}")
    fitting = [v for v in taking if dispatch.fits(v, inputs)] if inputs else taking
    return (fitting or taking)[-1]


def select(op: str, backend: str, step: int | None, dtype=None, inputs: tuple = ()) -> Variant:
    ladder = variants(op, backend)
    if step is None:
        return best(op, backend, dtype, inputs)
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(ladder):
        raise ValueError(f"{op}/{backend} has steps 1..{len(ladder)}, got step={step!r}")
    return ladder[step - 1]

