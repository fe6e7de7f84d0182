"""What the Triton linear_gelu steps share: the tanh GELU and its derivative on an fp32 tile, the
backward epilogue's deterministic column partials (dbias), and the host-side scratch for both.

GELU's tanh form through one exponential: 0.5 z (1 + tanh(u)) = z · sigmoid(2u), because
1 + tanh(u) = 2 / (1 + e^(-2u)). So gelu(z) = z / (1 + 2^(-v)) with v = 2 u log2(e) = z (C1 + C2 z^2),
the constants folded: per element 1 FMUL, 1 FFMA, 1 FMUL, 1 MUFU.EX2, 1 FADD, an approximate
divide (MUFU.RCP + FMUL). Large |z| is safe: 2^(-v) -> inf gives z / inf = -0, 2^(-v) -> 0 gives z.
(Triton's tl has no tanh; libdevice's tanhf is ~20 instructions and does not run in the
interpreter.) With s = sigmoid(2u): gelu'(z) = s + 2 z s (1 - s) du/dz, du/dz = sqrt(2/pi)(1 + 3·0.044715 z^2),
which is the spec's 0.5(1 + t) + 0.5 z (1 - t^2) du/dz with t = 2s - 1.
"""
import math

import torch
import triton
import triton.language as tl

from rosetta.triton_kernels.norm_common import empty_partials, sum_partials
from rosetta.triton_kernels.common import cdiv

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715
_C1 = 2.0 * SQRT_2_OVER_PI / math.log(2.0)  # 2 u log2(e) = z (C1 + C2 z^2)
C1 = tl.constexpr(_C1)
C2 = tl.constexpr(_C1 * CUBIC)
DU0 = tl.constexpr(SQRT_2_OVER_PI)  # du/dz = DU0 + DU2 z^2
DU2 = tl.constexpr(3.0 * SQRT_2_OVER_PI * CUBIC)

# The GEMM kernels' epilogues (a constexpr argument: one compilation each)
NONE = tl.constexpr(0)  # out = acc: the backward's da and dweight GEMMs
GELU = tl.constexpr(1)  # out = gelu(acc + bias): the forward
GELU_GRAD = tl.constexpr(2)  # dz = dy * gelu'(acc + bias), stored, and its column partials: the backward

# Rows of dz summed into one partial row of dbias. Every config's BLOCK_M is a multiple of it, so
# the number of partial rows, cdiv(M, PARTIAL_M), is known before the autotuner picks a tile: a
# tile of BLOCK_M rows writes its column sums into the first of its BLOCK_M / PARTIAL_M rows and
# zeros into the others (no rows left unwritten, no zero-fill launch).
PARTIAL_M = tl.constexpr(64)


@triton.jit
def sigmoid_2u(z):
    """sigmoid(2u) with u = sqrt(2/pi)(z + 0.044715 z^3), in fp32; approximate divide (2 ulp)."""
    v = z * (C1 + C2 * (z * z))
    return tl.fdiv(tl.full(z.shape, 1.0, tl.float32), 1.0 + tl.exp2(-v))


@triton.jit
def gelu(z):
    """The tanh GELU of an fp32 tile: z sigmoid(2u)."""
    return z * sigmoid_2u(z)


@triton.jit
def gelu_grad(z):
    """d gelu / dz of the tanh GELU, fp32."""
    s = sigmoid_2u(z)
    zz = z * z
    return s + 2.0 * z * s * (1.0 - s) * (DU0 + DU2 * zz)


@triton.jit
def load_bias(bias_ptr, cols, col_ok, stride_bias):
    """bias[cols] as an fp32 row; columns past N read 0 (their results are never stored)."""
    return tl.load(bias_ptr + cols * stride_bias, mask=col_ok, other=0.0).to(tl.float32)


@triton.jit
def store_column_partials(dz, partial_ptr, pid_m, cols, col_ok, N, num_partials,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile's column sums of dz (fp32; padded rows hold dz = 0) into partial row
    pid_m · BLOCK_M / PARTIAL_M of the (num_partials, N) fp32 scratch, zeros into the tile's other
    partial rows that exist. Each element of the scratch is written by exactly one tile."""
    RATIO: tl.constexpr = tl.constexpr(BLOCK_M) // PARTIAL_M  # (constexpr first: the interpreter's ints)
    tl.static_assert(RATIO * PARTIAL_M == BLOCK_M)
    row = pid_m.to(tl.int64) * RATIO  # < num_partials: the tile has at least one row below M
    tl.store(partial_ptr + row * N + cols, tl.sum(dz, axis=0), mask=col_ok)
    for r in tl.static_range(1, RATIO):
        tl.store(partial_ptr + (row + r) * N + cols, tl.zeros((BLOCK_N,), tl.float32),
                 mask=col_ok & (row + r < num_partials))


def partial_rows(m: int) -> int:
    return cdiv(m, PARTIAL_M.value)


def bias_partials(m: int, n: int, device) -> torch.Tensor:
    """The (1, cdiv(M, PARTIAL_M), N) fp32 scratch of dbias's column partials (every element
    written by the backward's first GEMM: no zeroing)."""
    return empty_partials(1, partial_rows(m), n, device)


def sum_bias(partial: torch.Tensor, dbias: torch.Tensor) -> None:
    """dbias = the partial rows summed in a fixed order (norm_common's kernel): the same bits
    every run."""
    sum_partials(partial, dbias)
