"""kernel-rosetta: GPU ops as CUDA C++ and Triton optimization ladders, side by side.

    import rosetta
    rosetta.vector_add(x, y)                          # best Triton step
    rosetta.vector_add(x, y, backend="cuda", step=1)  # the first CUDA step
    for v in rosetta.variants("vector_add"): print(v.label, v.header.changed)
"""
from .registry import BACKENDS, OPS, Header, RegistryError, Variant, best, ops_with_steps, select, variants

__all__ = ["OPS", "BACKENDS", "Variant", "Header", "RegistryError", "variants", "best", "ops_with_steps",
           "vector_add", "reduce_sum", "softmax", "matmul"]


def vector_add(x, y, *, backend="triton", step=None):
    """x + y, elementwise; same shape and dtype (fp32, fp16, bf16)."""
    return select("vector_add", backend, step)(x, y)


def reduce_sum(x, *, backend="triton", step=None):
    """Sum of all elements as a 0-dim float32 tensor (fp32 accumulation)."""
    return select("reduce_sum", backend, step)(x)


def softmax(x, *, backend="triton", step=None):
    """Softmax over the last dimension, any leading dimensions."""
    return select("softmax", backend, step)(x)


def matmul(a, b, *, backend="triton", step=None):
    """(M, K) @ (K, N) with fp32 accumulation; the output has the inputs' dtype."""
    return select("matmul", backend, step)(a, b)
