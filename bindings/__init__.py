"""kernel-rosetta: GPU ops as CUDA C++ and Triton optimization ladders, side by side.

    import rosetta
    rosetta.softmax(x)                                # the best Triton step for x.dtype
    rosetta.matmul(a, b, backend="cuda", step=1)      # the first CUDA step
    print(rosetta.explain("softmax", x))              # which step step=None runs for x, and why
    for v in rosetta.variants("softmax"): print(v.label, v.dtypes, v.header.changed)
"""
from .calls import call
from .registry import (BACKENDS, OPS, Decision, Header, RegistryError, Variant, best, decide, explain,
                       ops_with_steps, select, variants)

__all__ = ["OPS", "BACKENDS", "Variant", "Header", "RegistryError", "Decision", "variants", "best", "decide",
           "explain", "ops_with_steps", "vector_add", "reduce_sum", "softmax", "matmul"]


def vector_add(x, y, *, backend="triton", step=None):
    """x + y, elementwise; same shape and dtype (fp32, fp16, bf16)."""
    return call("vector_add", backend, step, (x, y))


def reduce_sum(x, *, backend="triton", step=None):
    """Sum of all elements as a 0-dim float32 tensor (fp32 accumulation)."""
    return call("reduce_sum", backend, step, (x,))


def softmax(x, *, backend="triton", step=None):
    """Softmax over the last dimension, any leading dimensions; differentiable."""
    return call("softmax", backend, step, (x,))


def matmul(a, b, *, backend="triton", step=None):
    """(M, K) @ (K, N) with fp32 accumulation; the output has the inputs' dtype; differentiable."""
    return call("matmul", backend, step, (a, b))
