"""From a Variant to a kernel launch: input checks, torch op registration, the two call paths.

`run` is the public path (checks, then the registered torch op, which allocates the output).
`run_into` is the bench's path (checks, then a launch into a preallocated output).
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys

import torch

from .ops import SPECS
from .registry import REPO, Variant, variants


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1: Triton steps then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_inputs(v: Variant, inputs: tuple) -> None:
    """Every bad input is refused here, before any launch, with what was expected.
    Order: argument types, dtypes, shapes, devices."""
    spec = SPECS[v.op]
    if len(inputs) != len(spec.inputs):
        raise TypeError(f"{v.label} takes {len(spec.inputs)} tensors {spec.inputs}, got {len(inputs)}")
    for name, t in zip(spec.inputs, inputs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{v.label}: {name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = inputs[0].dtype
    if any(t.dtype != dtype for t in inputs):
        got = ", ".join(f"{n}: {t.dtype}" for n, t in zip(spec.inputs, inputs))
        raise ValueError(f"{v.label}: all inputs must share one dtype, got {got}")
    if dtype not in v.dtypes:
        raise ValueError(f"{v.label} supports dtypes {[str(d) for d in v.dtypes]}, got {dtype}")
    spec.check_shapes(v.label, *inputs)
    device = inputs[0].device
    if any(t.device != device for t in inputs):
        got = ", ".join(f"{n} on {t.device}" for n, t in zip(spec.inputs, inputs))
        raise ValueError(f"{v.label}: all inputs must be on one device, got {got}")
    if device.type != "cuda" and not (v.backend == "triton" and interpreting()):
        hint = " (or set TRITON_INTERPRET=1 to run Triton steps on the CPU)" if v.backend == "triton" else ""
        raise ValueError(f"{v.label} needs CUDA tensors, got a tensor on {device}{hint}")


def run(v: Variant, *inputs):
    check_inputs(v, inputs)
    ensure_loaded(v.backend)
    return getattr(torch.ops.rosetta, v.qualname)(*inputs)


def run_into(v: Variant, *inputs, out):
    check_inputs(v, inputs)
    ensure_loaded(v.backend)
    if v.backend == "cuda":
        getattr(torch.ops.rosetta, v.qualname + "_out")(*inputs, out)
    else:
        from torch._library.triton import set_wrap_triton_enabled

        with set_wrap_triton_enabled(False):  # a plain launch: nothing is being traced
            triton_module(v).launch(*(t.contiguous() for t in inputs), out)
    return out


# ---- registration -------------------------------------------------------------------------------
_loaded = {"cuda": False, "triton": False}


def ensure_loaded(backend: str) -> None:
    """Register every step of `backend` as a torch op (a plain flag check once done)."""
    if _loaded[backend]:
        return
    if backend == "cuda":
        from . import cuda_build

        cuda_build.load()
        names = [(v.qualname, SPECS[v.op]) for v in variants(backend="cuda")]
        # library reference tiers built into the same extension, e.g. reduce_sum_cub
        names += [(f"{op}_{lib}", spec) for op, spec in SPECS.items() for lib in spec.tiers]
        for name, spec in names:
            torch.library.register_fake(f"rosetta::{name}")(spec.allocate)
            torch.library.register_fake(f"rosetta::{name}_out")(lambda *args: None)
    else:
        for v in variants(backend="triton"):
            _register_triton(v)
    _loaded[backend] = True


def triton_module(v: Variant):
    """Import a Triton step file (its name starts with a digit, so by path)."""
    name = f"rosetta.triton_kernels.{v.op}.{REPO.joinpath(v.source).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / v.source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _register_triton(v: Variant) -> None:
    spec, launch = SPECS[v.op], triton_module(v).launch

    def host(*inputs):
        inputs = tuple(t.contiguous() for t in inputs)
        out = spec.allocate(*inputs)
        launch(*inputs, out)
        return out

    # triton_op infers the op schema from the signature: one Tensor per named input.
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
              for n in spec.inputs]
    host.__signature__ = inspect.Signature(params, return_annotation=torch.Tensor)
    torch.library.triton_op(f"rosetta::{v.qualname}", host, mutates_args=())
