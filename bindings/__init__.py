"""kernel-rosetta: GPU ops as CUDA C++ and Triton optimization ladders, side by side.

    import rosetta
    rosetta.softmax(x)                                # the best Triton step for x.dtype
    rosetta.matmul(a, b, backend="cuda", step=1)      # the first CUDA step
    print(rosetta.explain("softmax", x))              # which step step=None runs for x, and why
    for v in rosetta.variants("softmax"): print(v.label, v.dtypes, v.header.changed)
"""
import torch

from .calls import call
from .registry import (BACKENDS, OPS, Decision, Header, RegistryError, Variant, best, decide, explain,
                       ops_with_steps, select, variants)

__all__ = ["OPS", "BACKENDS", "Variant", "Header", "RegistryError", "Decision", "variants", "best", "decide",
           "explain", "ops_with_steps", "vector_add", "reduce_sum", "softmax", "matmul", "rms_norm", "layer_norm",
           "dropout", "linear_gelu", "attention"]


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


def rms_norm(x, weight, eps=1e-5, *, backend="triton", step=None):
    """x * rstd * weight over the last dimension, rstd = 1/sqrt(mean(x^2) + eps), fp32 inside;
    weight of x.shape[-1], x's dtype; differentiable (x and weight)."""
    return call("rms_norm", backend, step, (x, weight), (float(eps),))


def layer_norm(x, weight, bias, eps=1e-5, *, backend="triton", step=None):
    """(x - mean) * rstd * weight + bias over the last dimension (biased variance), fp32 inside;
    weight and bias of x.shape[-1], x's dtype; differentiable (x, weight and bias)."""
    return call("layer_norm", backend, step, (x, weight, bias), (float(eps),))


def dropout(x, p=0.1, *, seed=None, offset=0, backend="triton", step=None):
    """x * 1/(1-p) where kept, else 0, with the mask of Philox4x32-10 at (seed, offset): the same
    seed and offset give the same mask in both backends and every step, and the backward
    regenerates it (no mask is stored). offset counts groups of 4 elements: a second draw from
    the same seed starts at offset + ceil(numel / 4). seed=None draws one from torch's generator."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if seed is None:
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    return call("dropout", backend, step, (x,), (float(p), int(seed), int(offset)))


def linear_gelu(a, weight, bias, *, backend="triton", step=None):
    """gelu(a @ weight + bias) with the tanh GELU: a (M, K), weight (K, N) (an nn.Linear weight W
    of (N, K) is W.t()), bias (N,); bf16/fp16, fp32 accumulation; differentiable (a, weight, bias:
    the backward recomputes a @ weight instead of keeping it)."""
    return call("linear_gelu", backend, step, (a, weight, bias))


def attention(q, k, v, *, causal=False, scale=None, backend="triton", step=None):
    """softmax(scale * q k^T) v per batch and head: q (B, H, Sq, D), k and v (B, H, Sk, D), head_dim
    64 or 128, bf16/fp16. causal masks key j for query i when j > i (top-left, as
    F.scaled_dot_product_attention); scale=None is 1/sqrt(head_dim). Differentiable (q, k, v)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return call("attention", backend, step, (q, k, v), (int(bool(causal)), float(scale)))
