"""The one registry: every discovered step as a Variant, the public handle that runs it.

Steps are found by bindings/steps.py; this module only adds the call paths (through dispatch) and
the lookups: variants(), best() / decide() / explain() (step=None's choice), select(). Tests,
bench, line counts, ncu runs and KERNEL_LOG tables all iterate variants().
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from . import dispatch, dispatch_table
from .ops import OPS
from .steps import BACKENDS, REPO, Header, RegistryError, Step, all_steps

__all__ = ["OPS", "BACKENDS", "REPO", "Header", "RegistryError", "Variant", "Decision", "variants", "best",
           "decide", "explain", "select", "ops_with_steps"]


@dataclass(frozen=True, eq=False, repr=False)
class Variant(Step):
    def __call__(self, *inputs, params: tuple | None = None):
        """Run this step (forward): checked inputs, the registered torch op, new outputs (all of
        them, saved statistics too). `params`: the op's non-tensor arguments, else its defaults."""
        return dispatch.run(self, "forward", inputs, params)

    def backward(self, *inputs, params: tuple | None = None):
        """Run this step's backward kernel (softmax: y, dy -> dx)."""
        return dispatch.run(self, "backward", inputs, params)

    def launch_into(self, *inputs, out, direction: str = "forward"):
        """Launch into preallocated `out` (no allocation: what the bench times)."""
        self.launcher(direction, inputs, out)[0]()
        return out

    def launcher(self, direction: str, inputs: tuple, out, params: tuple | None = None, **overrides):
        """(launch, copied): checks and layout copies now, then launch() runs only the kernel.
        `params`: the op's non-tensor arguments, else its defaults. `overrides`: keyword arguments
        for a Triton step's launch() (a bench ablation tier)."""
        return dispatch.launcher(self, direction, inputs, out, params, **overrides)


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


@dataclass(frozen=True)
class Decision:
    """Which step step=None runs for some inputs, and why: `str()` is what rosetta.explain shows."""
    variant: Variant
    reason: str
    alternatives: tuple = ()  # ((step, p50_ms, fits), ...) measured at the matched case

    def __str__(self) -> str:
        lines = [f"{self.variant.label}: {self.reason}"]
        if self.alternatives:
            fastest = self.alternatives[0][1]
            lines.append("measured there (median of CUDA-graph replays, L2 flushed):")
            for step, ms, fits in self.alternatives:
                note = "" if fits else "  (its declared limits refuse these inputs)"
                lines.append(f"  step {step:2d}  {ms * 1e3:10.1f} us  {ms / fastest:5.2f}x the fastest{note}")
        return "\n".join(lines)

    __repr__ = __str__


def _ladder(op: str, backend: str) -> list[Variant]:
    ladder = variants(op, backend)
    if not ladder:
        raise ValueError(f"{op} has no {backend} steps yet")
    return [v for v in ladder if not v.hazard] or ladder


def _last_fitting(op: str, backend: str, dtype, inputs: tuple) -> Variant:
    """The rule without a table: the last (most optimized) step that takes `dtype` and whose
    declared limits the inputs fit (with none left, the last one that takes `dtype` says why),
    passing over a step declared slower than an earlier one (`Slower:`) where another fits."""
    ladder = _ladder(op, backend)
    if dtype is None:
        candidates = ladder
    else:
        taking = [v for v in ladder if dtype in v.dtypes]
        if not taking:
            raise ValueError(f"no {op}/{backend} step takes {dtype}; the steps take "
                             f"{sorted({str(d) for v in ladder for d in v.dtypes})}")
        candidates = [v for v in taking if dispatch.fits(v, inputs)] if inputs else taking
        candidates = candidates or taking
    return ([v for v in candidates if not v.slower] or candidates)[-1]


def decide(op: str, backend: str, dtype=None, inputs: tuple = (), device=None) -> Decision:
    """step=None's choice: from this GPU's measured table (dispatch_table) when it has a case for
    the op, backend and dtype, else the last step that takes the inputs and is not declared slower
    than an earlier one. A step with a declared hazard (a known way to go wrong) is run only when
    asked for by number. `device`: where the inputs will run, when they are stand-ins
    (torch.compile's choice on meta tensors)."""
    def fallback(why: str, alternatives: tuple = ()) -> Decision:
        chosen = _last_fitting(op, backend, dtype, inputs)
        passed = [str(v.step) for v in _ladder(op, backend) if v.step > chosen.step and v.slower]
        past = (f"; step{'s' if len(passed) > 1 else ''} {', '.join(passed)} after it, declared slower, "
                f"passed over") if passed else ""
        return Decision(chosen, f"the last step that takes the inputs ({why}){past}", alternatives)

    tensors = bool(inputs) and all(isinstance(t, torch.Tensor) for t in inputs)
    if not tensors or dtype is None:
        return fallback("no inputs given to match against the measured table")
    device = device or inputs[0].device
    table = dispatch_table.for_device(device)
    found = table.nearest(op, backend, dtype, inputs) if table else None
    if found is None:
        where = ("no measured table for this GPU" if table is None and device.type == "cuda" else
                 "no table for CPU tensors" if table is None else
                 f"the table of {table.gpu} has no {op}/{backend} {dtype} case")
        return fallback(f"{where}; `make bench-suite` measures one")
    entry, dist, same_layout = found
    ladder = {v.step: v for v in _ladder(op, backend)}
    # a gradient to take: the step's backward runs too, so rank by forward + backward where timed
    grad = bool(entry.grad_ranking) and dispatch.takes_grad(inputs)
    ranking = entry.grad_ranking if grad else entry.ranking
    alternatives = tuple((s, ms, s in ladder and dispatch.fits(ladder[s], inputs)) for s, ms in ranking)
    chosen = next((ladder[s] for s, _, fits in alternatives if fits), None)
    shape = "x".join(map(str, entry.shape))
    where = (f"fastest{' forward + backward' if grad else ''} measured at {shape} (layout {entry.layout}"
             + ("" if same_layout else f"; these inputs are {dispatch_table.layout_class(inputs)}, not measured")
             + (", the same shape class)" if dist == 0 else f"), the nearest measured case: {dist:.1f} octaves away)")
             + f" on {table.gpu}, run {entry.run or table.git_sha}"
             + ("; a headline shape of the bench" if entry.source == "headline" else ""))
    if chosen is None:
        return fallback(f"none of the steps {where} takes them", alternatives)
    return Decision(chosen, where, alternatives)


def best(op: str, backend: str, dtype=None, inputs: tuple = ()) -> Variant:
    """The step used when step=None (decide() says why)."""
    return decide(op, backend, dtype, inputs).variant


def explain(op: str, *inputs, backend: str = "triton") -> Decision:
    """Why rosetta.<op>(*inputs, backend=backend) runs the step it runs: the matched shape class
    and the measured alternatives (print it)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    dtype = getattr(inputs[0], "dtype", None) if inputs else None
    return decide(op, backend, dtype, inputs)


def select(op: str, backend: str, step: int | None, dtype=None, inputs: tuple = ()) -> Variant:
    ladder = variants(op, backend)
    if step is None:
        return best(op, backend, dtype, inputs)
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(ladder):
        raise ValueError(f"{op}/{backend} has steps 1..{len(ladder)}, got step={step!r}")
    return ladder[step - 1]

