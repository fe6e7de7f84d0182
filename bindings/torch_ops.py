"""Every step as a torch op: `torch.ops.rosetta.<op>_<backend>_<NN>_<name>` (and `..._backward` for
an op with a backward), with a fake implementation, so torch.compile(fullgraph=True) traces it and
torch.library.opcheck passes; differentiable ops get autograd through the same step's kernels.

CUDA steps: the kernel is the extension module's function `<qualname>_out` that the generated
binding defines; the functional op around it is a custom_op. Triton steps: the functional op is a
triton_op, so torch.compile sees into the kernels. Both run the same host code: make the inputs
fit the step's layout (copy only if they do not), allocate the output, launch.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from types import SimpleNamespace

import torch

from . import cuda_build, triton_launch
from .ops import SPECS
from .ops.spec import as_tuple, fits_layout, layout_copy
from .steps import REPO, Step, all_steps


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1: Triton steps then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_inputs(v: Step, direction: str, inputs: tuple) -> tuple[tuple, list[str]]:
    """The inputs as the step's kernels see them (the spec's view), each copied only when it breaks
    the step's declared layout or cannot be viewed without a copy; a copy is row-major with
    16-byte-aligned rows (`layout_copy`). Also returns the names of the copied inputs (the
    bench reports them instead of timing the copy)."""
    spec = SPECS[v.op]
    names = spec.directions()[direction].inputs
    views, copied = [], []
    for name, t in zip(names, inputs):
        try:
            view = spec.view(name, t)
        except RuntimeError:  # the view would need a copy (e.g. leading dims that cannot fold)
            view = None
        if view is None or not fits_layout(view, v.layout):
            view = spec.view(name, layout_copy(t, v.layout))
            copied.append(name)
        views.append(view)
    return tuple(views), copied


# ---- the kernels themselves ---------------------------------------------------------------------
def triton_module(v: Step):
    """Import a Triton step file (its name starts with a digit, so by path)."""
    name = f"rosetta.triton_kernels.{v.op}.{REPO.joinpath(v.source).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / v.source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        for loaded in [m for n, m in sys.modules.items() if n.startswith("rosetta.triton_kernels.")]:
            triton_launch.install(loaded)  # the step and the shared modules it imported
    return sys.modules[name]


def _op_name(v: Step, direction: str) -> str:
    return v.qualname + ("" if direction == "forward" else f"_{direction}")


def output_views(op: str, direction: str, out) -> tuple:
    """The kernel's views of a direction's output(s), in order."""
    spec = SPECS[op]
    return tuple(spec.view(name, t) for name, t in zip(spec.directions()[direction].outputs, as_tuple(out)))


def kernel(v: Step, direction: str):
    """(*kernel_inputs, *output_views, *params) -> None: the step's launch for one direction."""
    if v.backend == "triton":
        module = triton_module(v)
        fn = getattr(module, "launch" if direction == "forward" else f"launch_{direction}", None)
        if fn is None:
            raise NotImplementedError(f"{v.source} has no launch_{direction}()")
        return on_tensors_device(fn)
    return getattr(cuda_build.load(), _op_name(v, direction) + "_out")  # pybind11: no dispatcher in between


def allocating_launcher(v: Step, direction: str):
    """A CUDA step's (*kernel_inputs, *output templates, *params) -> output(s): the extension's
    `<qualname>_new`, which allocates each output as its template (a meta tensor) in C++ and
    launches into it."""
    return getattr(cuda_build.load(), _op_name(v, direction) + "_new")


def _current_device() -> int:
    return torch._C._cuda_getDevice()  # what torch.cuda.current_device() returns, without its Python checks


def on_tensors_device(fn):
    """Triton launches on the *current* device; the tensors may live on another (inputs on cuda:1
    while cuda:0 is current). The CUDA binding sets a device guard for the same reason."""
    def launch(*tensors, **overrides):
        device = tensors[0].get_device()  # -1 on the CPU (the interpreter); an int: no device object
        if device < 0 or device == _current_device():
            return fn(*tensors, **overrides)
        with torch.cuda.device(device):
            return fn(*tensors, **overrides)

    return launch


def raw_launcher(v: Step, direction: str):
    """The kernel launch with nothing around it (the bench's graph captures exactly this; the
    public call's eager path calls it too)."""
    fn = kernel(v, direction)
    if v.backend == "cuda":
        return fn
    from torch._library.triton import wrap_triton_enabled

    def plain(*args, **overrides):
        # a plain launch, nothing being traced: wrap_triton hands back the kernel's cached
        # launcher (triton_launch), not torch's traceable wrapper. The
        # thread-local switch set_wrap_triton_enabled(False) flips, without its context manager
        # (a generator per call, measurable at a few us a launch).
        previous = getattr(wrap_triton_enabled, "value", True)
        wrap_triton_enabled.value = False
        try:
            fn(*args, **overrides)
        finally:
            wrap_triton_enabled.value = previous

    return plain


# ---- registration -------------------------------------------------------------------------------
_registered: dict[str, SimpleNamespace] = {}


def op(v: Step, direction: str = "forward"):
    """The registered functional torch op of a step (registering its backend on first use)."""
    if v.qualname not in _registered:
        for step in all_steps():
            if step.backend == v.backend:
                _registered[step.qualname] = _register(step)
    return getattr(_registered[v.qualname], direction)


def _register(v: Step) -> SimpleNamespace:
    spec = SPECS[v.op]
    ops = {}
    for direction, d in spec.directions().items():
        name = f"rosetta::{_op_name(v, direction)}"
        host = _host(v, direction, d)
        if v.backend == "triton":
            torch.library.triton_op(name, host, mutates_args=())
        else:
            torch.library.custom_op(name, host, mutates_args=())
            torch.library.register_fake(name)(_fake(d))
        ops[direction] = getattr(torch.ops.rosetta, _op_name(v, direction)).default
    step_ops = SimpleNamespace(forward=ops["forward"], backward=ops.get("backward"))
    if spec.autograd:
        setup, grads = spec.autograd
        tensors, no_grads = len(spec.forward.inputs), (None,) * len(spec.forward.params)

        def setup_context(ctx, inputs, output):  # inputs: the tensors, then the params
            setup(ctx, inputs[:tensors], output, inputs[tensors:])

        torch.library.register_autograd(f"rosetta::{v.qualname}",
                                        lambda ctx, *g: (*as_tuple(grads(step_ops, ctx, *g)), *no_grads),
                                        setup_context=setup_context)
    return step_ops


def _host(v: Step, direction: str, d):
    """The functional op's body: layout copies if needed, new outputs, the launch."""
    launch = None
    tensors = len(d.inputs)

    def host(*args):
        nonlocal launch
        if launch is None:
            launch = kernel(v, direction)  # resolved at the first call (CUDA: builds the extension)
        inputs = args[:tensors]
        views, _ = kernel_inputs(v, direction, inputs)
        out = d.allocate(*inputs)
        launch(*views, *output_views(v.op, direction, out), *args[tensors:])
        return out

    # custom_op/triton_op infer the schema from the signature: one Tensor per named input, then
    # the params (float or int), returning a Tensor or a tuple of them.
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = ([inspect.Parameter(n, kind, annotation=torch.Tensor) for n in d.inputs]
              + [inspect.Parameter(p.name, kind, annotation=p.kind) for p in d.params])
    returns = torch.Tensor if len(d.outputs) == 1 else tuple[(torch.Tensor,) * len(d.outputs)]
    host.__signature__ = inspect.Signature(params, return_annotation=returns)
    host.__name__ = _op_name(v, direction)
    return host


def _fake(d):
    """The fake implementation: allocate's outputs (the params change no shape)."""
    def fake(*args):
        return d.allocate(*args[:len(d.inputs)])
    return fake
