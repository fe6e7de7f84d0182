"""The public call (rosetta.softmax(x) and co.): every guarantee of the registered torch op at the
host cost of a plain launch.

The work a call repeats is done once per *call signature* (op, backend, step, whether a gradient
will be taken, and per input its dtype, shape, strides, device and 16-byte alignment): choosing the step
(the measured table's lookup), checking the inputs, deciding which inputs the step's layout makes
copy. A repeated call looks its signature up, allocates the output and launches the step's kernel:
the C++ op for a CUDA step, the Triton kernel for a Triton step, with no custom-op dispatch around
it. With a gradient to take, a small autograd.Function runs the same step's kernels (softmax: its
backward kernel; matmul: the step on transposed views). While torch.compile, make_fx or another
dispatch mode traces, or a tensor is a subclass, the call takes the registered torch op instead
(dispatch.run), which is what tracing sees and what opcheck tests.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from . import dispatch, registry, torch_ops
from .ops import SPECS
from .ops.spec import fits_layout

MAX_SIGNATURES = 4096  # cached call signatures; past this the cache starts again
_PREPARED: dict = {}
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def call(op: str, backend: str, step: int | None, inputs: tuple):
    """rosetta.<op>(*inputs, backend=backend, step=step)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() \
            or not all(type(t) in _PLAIN and t.layout == torch.strided for t in inputs):
        return registered_call(op, backend, step, inputs)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    key = (op, backend, step, grad, *[(t.dtype, t.shape, t.stride(), t.device, t.data_ptr() % 16) for t in inputs])
    run = _PREPARED.get(key)
    if run is None:
        run = prepare(op, backend, step, inputs, grad)  # raises, caching nothing, on bad inputs
        if len(_PREPARED) >= MAX_SIGNATURES:
            _PREPARED.clear()
        _PREPARED[key] = run
    return run(*inputs)


def forget() -> None:
    """Drop every cached signature (after the dispatch table changed)."""
    _PREPARED.clear()


def registered_call(op: str, backend: str, step: int | None, inputs: tuple):
    """The path tracing sees: choose, check, then the step's registered torch op."""
    dtype = getattr(inputs[0], "dtype", None) if inputs else None
    if step is None and torch.compiler.is_compiling() and all(isinstance(t, torch.Tensor) for t in inputs):
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        step = traced_choice(op, backend, dtype, tuple(tuple(t.shape) for t in inputs),
                             tuple(t.stride() for t in inputs), str(inputs[0].device), grad)
    return dispatch.run(registry.select(op, backend, step, dtype, inputs), "forward", inputs)


def traced_choice(op: str, backend: str, dtype, shapes: tuple, strides: tuple, device: str, grad: bool) -> int:
    """step=None's choice while torch.compile traces, made as in eager (the measured table) but
    from shapes and strides alone: traced tensors have no data, so the choice is made on empty
    meta tensors of the same layout, whose addresses read as aligned (the chosen step's own checks
    judge the real ones at run time). Dynamo runs this once per trace and keeps the step number."""
    metas = tuple(torch.empty_strided(s, st, dtype=dtype, device="meta").requires_grad_(grad)
                  for s, st in zip(shapes, strides))
    return registry.decide(op, backend, dtype, metas, device=torch.device(device)).variant.step


# What torch._dynamo.assume_constant_result(traced_choice) does, without importing torch._dynamo at
# `import rosetta` (it pulls in Inductor and Triton, ~1 s, and Triton must not be imported before
# TRITON_INTERPRET is set, as `make bench` sets it on a machine with no GPU).
traced_choice._dynamo_marked_constant = True


def prepare(op: str, backend: str, step: int | None, inputs: tuple, grad: bool):
    """The callable a signature runs: step chosen and inputs checked here, once."""
    v = registry.select(op, backend, step, inputs[0].dtype if inputs else None, inputs)
    dispatch.check_inputs(v, "forward", inputs)
    torch_ops.op(v)  # registered now, in eager: torch.compile may trace this step later
    if grad and SPECS[op].autograd:
        return differentiable(v)
    return direct(v, "forward", inputs)


def direct(v, direction: str, inputs: tuple | None = None):
    """(*inputs) -> output through the step's kernel, no torch op around it. Given example
    `inputs`, whether any must be copied into the step's layout, and whether the kernel's view of
    the tensors is the tensors themselves, is decided once from them (the signature fixes their
    shapes and strides); without, every call asks (kernel_inputs)."""
    spec = SPECS[v.op]
    allocate = spec.directions()[direction].allocate
    raw = torch_ops.raw_launcher(v, direction)
    view = spec.kernel_view
    as_is = inputs is not None and all(_viewable(view, t) and fits_layout(view(t)[0], v.layout) for t in inputs)
    out_like = allocate(*(torch.empty_like(t, device="meta") for t in inputs)) if as_is else None  # no memory
    if as_is and all(view(t)[0].shape == t.shape for t in (*inputs, out_like)):
        def run_plain(*tensors):  # the kernel takes the tensors as they are (e.g. 2-D softmax rows)
            out = allocate(*tensors)
            raw(*tensors, out)
            return out
        return run_plain

    def run(*tensors):
        views = view(*tensors) if as_is else torch_ops.kernel_inputs(v, direction, tensors)[0]
        out = allocate(*tensors)
        raw(*views, *view(out))
        return out

    return run


def _viewable(view, t) -> bool:
    try:
        view(t)
    except RuntimeError:  # the view needs a copy (leading dimensions that cannot fold)
        return False
    return True


_FUNCTIONS: dict = {}


def differentiable(v):
    """The step as an autograd.Function (one class per step, made once): forward and backward
    run its kernels directly, with the spec's autograd rules (what to save, how to form the
    gradients) as the registered op uses them."""
    if v.qualname not in _FUNCTIONS:
        setup, grads = SPECS[v.op].autograd
        ops = SimpleNamespace(forward=direct(v, "forward"),
                              backward=direct(v, "backward") if SPECS[v.op].backward else None)

        def forward(ctx, *inputs):
            out = ops.forward(*inputs)
            setup(ctx, inputs, out)
            return out

        def backward(ctx, grad):
            return grads(ops, ctx, grad)

        _FUNCTIONS[v.qualname] = type(f"{v.qualname}_function", (torch.autograd.Function,),
                                      {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    return _FUNCTIONS[v.qualname].apply
