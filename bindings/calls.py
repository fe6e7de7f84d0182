"""The public call (rosetta.softmax(x) and co.): every guarantee of the registered torch op at the
host cost of a plain launch.

The work a call repeats is done once per *call signature* (op, backend, step, whether grad mode
is on, and per input its dtype, shape, strides, device, 16-byte alignment and requires_grad): choosing the step
(the measured table's lookup), checking the inputs, deciding which inputs the step's layout makes
copy. A repeated call looks its signature up, allocates the output and launches the step's kernel:
the C++ op for a CUDA step (which allocates its outputs in C++ too), the Triton kernel for a Triton
step, with no custom-op dispatch around it. A Triton step's launch() is recorded on one of its
signature's first calls and replayed after (triton_launch.Replay): its workspaces taken as one
block of memory, its compiled kernels launched on raw pointers.
With a gradient to take, a small autograd.Function runs the same step's kernels (softmax: its
backward kernel; matmul: the step on transposed views). While torch.compile, make_fx or another
dispatch mode traces, or a tensor is a subclass, the call takes the registered torch op instead
(dispatch.run), which is what tracing sees and what opcheck tests.
"""
from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from . import dispatch, registry, torch_ops, triton_launch
from .ops import SPECS
from .ops.spec import as_tuple, fits_layout

MAX_SIGNATURES = 4096  # cached call signatures; past this the cache starts again
_PREPARED: dict = {}
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
# looked up once: each is a C function, and an attribute chain costs about as much as the call
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled
_empty_strided = torch.empty_strided
# autograd.Function.apply is a Python classmethod around this C one: it checks for functorch
# transforms and unwraps dead functorch wrappers on every call (~1.5 us), then calls it.
# call() checks for transforms itself, once, for every path.
_apply_c = torch._C._FunctionBase.__dict__["apply"]
_functorch_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def call(op: str, backend: str, step: int | None, inputs: tuple, params: tuple = ()):
    """rosetta.<op>(*inputs, backend=backend, step=step) with the op's params (eps, p, ...) in
    order: the forward's outputs that the public call returns (saved statistics are not)."""
    # first: a tracer must not see data_ptr() below, nor a functorch transform (torch.func.grad,
    # vmap), whose wrapped tensors have no storage to point at
    if _is_compiling() or _dispatch_modes() or _functorch_active():
        return registered_call(op, backend, step, inputs, params)
    grad_mode = _grad_enabled()
    key = [op, backend, step, grad_mode]
    for t in inputs:  # one pass: the signature, and whether this call can run eagerly at all
        if type(t) not in _PLAIN or t.layout is not _STRIDED:
            return registered_call(op, backend, step, inputs, params)
        key += (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() % 16, t.requires_grad)
    key = tuple(key)
    run = _PREPARED.get(key)
    if run is None:
        grad = grad_mode and any(t.requires_grad for t in inputs)
        run = prepare(op, backend, step, inputs, grad)  # raises, caching nothing, on bad inputs
        if len(_PREPARED) >= MAX_SIGNATURES:
            _PREPARED.clear()
        _PREPARED[key] = run
    return run(*inputs, *params)


def forget() -> None:
    """Drop every cached signature (after the dispatch table changed)."""
    _PREPARED.clear()


def registered_call(op: str, backend: str, step: int | None, inputs: tuple, params: tuple = ()):
    """The path tracing sees: choose, check, then the step's registered torch op."""
    # a non-tensor input (a NumPy array, a list) has no torch dtype to choose by: the step's checks
    # then refuse it by its type
    dtype = inputs[0].dtype if inputs and isinstance(inputs[0], torch.Tensor) else None
    if step is None and torch.compiler.is_compiling() and all(isinstance(t, torch.Tensor) for t in inputs):
        grad = dispatch.takes_grad(inputs)
        step = traced_choice(op, backend, dtype, tuple(tuple(t.shape) for t in inputs),
                             tuple(t.stride() for t in inputs), str(inputs[0].device), grad)
    return public(op, dispatch.run(registry.select(op, backend, step, dtype, inputs), "forward", inputs, params))


def public(op: str, out):
    """What the public call returns of the forward's outputs: not the saved statistics."""
    spec = SPECS[op]
    if not spec.saved:
        return out
    kept = spec.public_outputs()
    return out[0] if kept == 1 else out[:kept]


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
    """The callable a signature runs, (*inputs, *params) -> the public outputs: step chosen and
    inputs checked here, once."""
    v = registry.select(op, backend, step, inputs[0].dtype if inputs else None, inputs)
    dispatch.check_inputs(v, "forward", inputs)
    torch_ops.op(v)  # registered now, in eager: torch.compile may trace this step later
    run = differentiable(v, inputs) if grad and SPECS[op].autograd else direct(v, "forward", inputs)
    if not SPECS[op].saved:
        return run
    return lambda *args: public(op, run(*args))


def direct(v, direction: str, inputs: tuple | None = None):
    """(*inputs, *params) -> output(s) through the step's kernel, no torch op around it. Given
    example `inputs`, whether any must be copied into the step's layout, and whether the kernel's
    view of the tensors is the tensors themselves, is decided once from them (the signature fixes
    their shapes and strides); without, every call asks (kernel_inputs)."""
    spec = SPECS[v.op]
    d = spec.directions()[direction]
    allocate, raw, n, several = d.allocate, torch_ops.raw_launcher(v, direction), len(d.inputs), len(d.outputs) > 1
    as_is = inputs is not None and all(_viewable(spec, name, t) and fits_layout(spec.view(name, t), v.layout)
                                       for name, t in zip(d.inputs, inputs))
    if as_is and v.backend == "triton" and inputs[0].is_cuda:  # the signature fixes what launch() does
        raw = triton_launch.Replay(raw, inputs[0].device, n + len(d.outputs))
    if as_is:
        outs_like = as_tuple(allocate(*(torch.empty_like(t, device="meta") for t in inputs)))  # no memory
        in_views = [_kernel_view(spec, name, t) for name, t in zip(d.inputs, inputs)]
        out_views = [_kernel_view(spec, name, t) for name, t in zip(d.outputs, outs_like)]
        viewed_inputs = any(f for _, f in in_views)
        in_fns = [f or _same for _, f in in_views]
        if v.backend == "cuda" and all(f is None or shape is not None for shape, f in out_views):
            # the outputs allocated in C++ beside the launch, each from a meta template, and handed
            # to the kernel as its view's template (a reshape) says
            new = torch_ops.allocating_launcher(v, direction)
            templates = (*outs_like, *(spec.view(name, o) for name, o in zip(d.outputs, outs_like)))
            if not viewed_inputs:  # a C call with the templates bound: no Python frame per call
                return partial(new, *templates)

            def run_new_viewed(*args):  # e.g. softmax over (batch, rows, columns): rows folded
                return new(*templates, *[f(t) for f, t in zip(in_fns, args)], *args[n:])
            return run_new_viewed

        # allocate()'s outputs made straight from their sizes and strides, which the signature fixes:
        # torch.empty_strided parses its arguments in half the time new_empty(shape) takes
        device, made = inputs[0].device, [(tuple(o.shape), o.stride(), o.dtype) for o in outs_like]
        if not several and not viewed_inputs and not out_views[0][1]:  # the kernel takes the tensors as they are
            (shape, stride, dtype), = made

            def run_one(*args):  # e.g. 2-D softmax rows: one output, no view
                out = _empty_strided(shape, stride, dtype=dtype, device=device)
                raw(*args[:n], out, *args[n:])
                return out
            return run_one

        out_fns = [f or _same for _, f in out_views]

        def run_viewed(*args):  # several outputs, or the views this signature needs (reduce_sum's 0-dim output)
            out = tuple([_empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in made])
            raw(*[f(t) for f, t in zip(in_fns, args)], *[f(t) for f, t in zip(out_fns, out)], *args[n:])
            return out if several else out[0]
        return run_viewed

    def run(*args):  # inputs that may need a copy into the step's layout: asked on every call
        tensors = args[:n]
        views = torch_ops.kernel_inputs(v, direction, tensors)[0]
        out = allocate(*tensors)
        raw(*views, *torch_ops.output_views(v.op, direction, out), *args[n:])
        return out

    return run


def _same(t):
    return t


def _kernel_view(spec, name: str, example) -> tuple:
    """(shape, view) of the tensor called `name` for `example`'s signature: `view`, the kernel's
    view of it as a function (None where the view is the tensor itself); `shape`, the shape it
    reshapes to where the view is a plain reshape (then `view` is Tensor.view alone, without the
    spec's function around it: the signature fixes the shape), else None."""
    view = spec.view(name, example)
    if view.shape == example.shape:
        return None, None
    try:
        reshaped = example.view(view.shape)
    except RuntimeError:
        reshaped = None
    if view.dim() and reshaped is not None and reshaped.stride() == view.stride() \
            and reshaped.data_ptr() == view.data_ptr():
        shape = tuple(view.shape)  # ints, unpacked: torch parses a torch.Size argument ~3x slower
        return shape, lambda t: t.view(*shape)
    return None, lambda t: spec.view(name, t)


def _viewable(spec, name: str, t) -> bool:
    try:
        spec.view(name, t)
    except RuntimeError:  # the view needs a copy (leading dimensions that cannot fold)
        return False
    return True


_STEP_OPS: dict = {}


def differentiable(v, inputs: tuple):
    """The step as an autograd.Function for one call signature (made once, cached with it): the
    forward runs the signature's prepared launch, the backward the step's kernels on whatever
    tensors the spec's autograd rules hand it (softmax: its backward kernel; matmul: the step on
    transposed views), as the registered op does. Saved statistics are outputs without a
    gradient."""
    spec = SPECS[v.op]
    if v.qualname not in _STEP_OPS:
        _STEP_OPS[v.qualname] = SimpleNamespace(forward=direct(v, "forward"),
                                                backward=direct(v, "backward") if spec.backward else None)
    ops = _STEP_OPS[v.qualname]
    setup, grads = spec.autograd
    run = direct(v, "forward", inputs)
    n, no_grads, saved = len(inputs), (None,) * len(spec.forward.params), len(spec.saved)

    def forward(ctx, *args):
        out = run(*args)
        setup(ctx, args[:n], out, args[n:])
        if saved:
            ctx.mark_non_differentiable(*out[-saved:])
        return out

    def backward(ctx, *grad):
        return (*as_tuple(grads(ops, ctx, *grad)), *no_grads)

    function = type(f"{v.qualname}_function", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    apply = _apply_c.__get__(None, function)

    def call(*args):  # Function.apply's own steps (no functorch transform is active: see call())
        return apply(*map(_unwrap_if_dead, args[:n]), *args[n:])

    return call
