"""From a step to a kernel launch: input checks, the layout a step needs, the two call paths.

`run` is the public path: checks, then the step's registered torch op (which makes its own
output, copies an input only where the step's layout demands it, and is differentiable).
`launcher` is the bench's path: checks and layout copies once, up front, then a zero-argument
launch into preallocated outputs, with the names of the inputs that had to be copied. Params
(eps, p, a seed) not given are the spec's defaults.
"""
from __future__ import annotations

import torch

from . import torch_ops
from .ops import SPECS
from .steps import Step, all_steps
from .torch_ops import interpreting


def steps_taking(step: Step, dtype) -> str:
    """Which steps of step's ladder take dtype, for an error message."""
    numbers = [s.step for s in all_steps() if s.op == step.op and s.backend == step.backend
               and dtype in s.dtypes]
    if not numbers:
        return f"no {step.op}/{step.backend} step does"
    return f"{step.op}/{step.backend} steps {', '.join(map(str, numbers))} do"


def exceeded(v: Step, inputs: tuple) -> list[tuple[str, str, int, int]]:
    """(quantity, relation, limit, value) of every bound in the step's `Max:` / `Min:` lines that
    the inputs break."""
    bounds = SPECS[v.op].bounds
    return ([(q, "<=", limit, value) for q, limit in v.bounds if (value := bounds[q](*inputs)) > limit]
            + [(q, ">=", limit, value) for q, limit in v.minimums if (value := bounds[q](*inputs)) < limit])


def takes_grad(inputs: tuple) -> bool:
    """Whether a call on these inputs will take a gradient (its step's backward runs too)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


def bounded(v: Step, inputs: tuple) -> list[tuple[str, str, int, int, str]]:
    """exceeded() of the inputs, and with a gradient to take also of the backward's inputs as the
    forward's shape them (its kernels must take them too), each marked with its direction."""
    found = [(*b, "") for b in exceeded(v, inputs)]
    spec = SPECS[v.op]
    if spec.backward_inputs and takes_grad(inputs):
        found += [(*b, " in its backward") for b in exceeded(v, spec.backward_inputs(*inputs))]
    return found


def fits(v: Step, inputs: tuple) -> bool:
    """False only when well-formed inputs pass one of v's declared limits (its `Max:` / `Min:`
    lines, the backward's too when a gradient will be taken): how step=None skips a step that
    cannot take them. Malformed inputs count as fitting, so the chosen step's own checks refuse
    them with their message."""
    if not all(isinstance(t, torch.Tensor) for t in inputs) or inputs[0].dtype not in v.dtypes:
        return True
    try:
        SPECS[v.op].check_shapes(v.label, *inputs)
    except ValueError:
        return True
    return not bounded(v, inputs)


def check_inputs(v: Step, direction: str, inputs: tuple) -> None:
    """Every bad input is refused here, before any launch, with what was expected.
    Order: argument types, dtypes, shapes, devices, the step's declared bounds."""
    spec = SPECS[v.op]
    d = spec.directions()[direction]
    names = d.inputs
    if len(inputs) != len(names):
        raise TypeError(f"{v.label} {direction} takes {len(names)} tensors {names}, got {len(inputs)}")
    for name, t in zip(names, inputs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{v.label}: {name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = inputs[0].dtype
    for name, t in zip(names, inputs):
        if name in d.fixed_dtypes and t.dtype != d.fixed_dtypes[name]:
            raise ValueError(f"{v.label}: {name} must be {d.fixed_dtypes[name]} (what the forward saves), got {t.dtype}")
    if any(t.dtype != dtype for n, t in zip(names, inputs) if n not in d.fixed_dtypes):
        got = ", ".join(f"{n}: {t.dtype}" for n, t in zip(names, inputs) if n not in d.fixed_dtypes)
        raise ValueError(f"{v.label}: all inputs must share one dtype, got {got}")
    if dtype not in v.dtypes:
        raise ValueError(f"{v.label} takes {[str(d) for d in v.dtypes]}, got {dtype}; "
                         f"{steps_taking(v, dtype)}")
    spec.check_shapes(v.label, *inputs)
    device = inputs[0].device
    if any(t.device != device for t in inputs):
        got = ", ".join(f"{n} on {t.device}" for n, t in zip(names, inputs))
        raise ValueError(f"{v.label}: all inputs must be on one device, got {got}")
    if device.type != "cuda" and not (v.backend == "triton" and interpreting()):
        hint = (" (or set TRITON_INTERPRET=1 to run Triton steps on the CPU)" if v.backend == "triton" else
                "; without a GPU, run the Triton steps on the CPU instead: backend=\"triton\" with "
                "TRITON_INTERPRET=1 set before triton is imported")
        raise ValueError(f"{v.label} needs CUDA tensors, got a tensor on {device}{hint}")
    def over(s: Step) -> list:
        return bounded(s, inputs) if direction == "forward" else [(*b, "") for b in exceeded(s, inputs)]

    if broken := over(v):
        quantity, relation, limit, value, where = broken[0]
        others = [s.step for s in all_steps() if s.op == v.op and s.backend == v.backend
                  and dtype in s.dtypes and not over(s)]  # every limit of theirs holds
        what = " ".join((spec.bounds[quantity].__doc__ or "").split()).split(".")[0]
        raise ValueError(f"{v.label} takes {quantity} {relation} {limit}{where}, got {quantity} = {value}"
                         + (f" ({what})" if what else "") + f"; {v.op}/{v.backend} "
                         + (f"steps {', '.join(map(str, others))} take it" if others else "has no step that takes it"))


def run(v: Step, direction: str, inputs: tuple, params: tuple | None = None):
    check_inputs(v, direction, inputs)
    d = SPECS[v.op].directions()[direction]
    return torch_ops.op(v, direction)(*inputs, *(d.defaults if params is None else params))


def launcher(v: Step, direction: str, inputs: tuple, out, params: tuple | None = None, **overrides):
    """(launch, copied): `launch()` runs the step's kernel into `out` (a tensor, or a tuple of the
    direction's outputs), allocating nothing; `copied` names the inputs that broke the step's
    layout and were copied here, outside the launch. `overrides` go to a Triton step's launch()
    as keyword arguments (e.g. block=4)."""
    check_inputs(v, direction, inputs)
    views, copied = torch_ops.kernel_inputs(v, direction, inputs)
    raw = torch_ops.raw_launcher(v, direction)
    outs = torch_ops.output_views(v.op, direction, out)
    params = SPECS[v.op].directions()[direction].defaults if params is None else params
    return (lambda: raw(*views, *outs, *params, **overrides)), copied
