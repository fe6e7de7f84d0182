"""What rms_norm and layer_norm share: a row of the last dimension normalized and scaled by a
weight of the row's length, fp32 statistics of shape (*leading, 1) saved for the backward (as
torch's native_layer_norm and _fused_rms_norm return them), the rows x cols view, the error
yardsticks, the shapes and the suite. Each op's module holds its formula."""
import math

import torch

from .spec import Headline, Suite, as_is, dtype_label
from .softmax import rows_view

EPS = 1e-5  # torch's default for both F.layer_norm and nn.RMSNorm's usual configs
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def check_shapes(label, x, weight, *rest):
    """x (..., N), a weight (and bias) of N; the backward's statistics (*leading, 1) and dy x's."""
    if x.dim() == 0 or (x.shape[-1] == 0 and rows(x.shape) > 0):
        raise ValueError(f"{label}: normalizes over the last dimension, which x of shape {tuple(x.shape)} "
                         "does not have (or is empty: rows of no elements have no mean)")
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"{label}: weight must have shape ({n},), the length of x's last dimension, "
                         f"got {tuple(weight.shape)}")


def check_parts(label, x, named):
    """Every other tensor (name, tensor, expected shape) has its expected shape."""
    for name, t, shape in named:
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{label}: {name} must have shape {tuple(shape)} (x is {tuple(x.shape)}), "
                             f"got {tuple(t.shape)}")


def stats_shape(x):
    return (*x.shape[:-1], 1)


def rows(shape) -> int:
    return math.prod(shape[:-1])


def make_x(shape, dtype, device, gen):
    """x ~ N(1, 2^2): a mean far from 0 (LayerNorm's subtraction matters), and a weight around 1."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).mul_(2).add_(1).to(dtype)
    w = torch.randn(shape[-1:], generator=gen, dtype=torch.float32, device=device).mul_(0.5).add_(1).to(dtype)
    return x, w


def make_dy(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)


def relative(inputs, ref):
    """A statistic against itself (no cancellation inside: a sum of squares, or a mean's scale)."""
    return ref.abs() + torch.finfo(torch.float32).tiny


def column_sum_scale(terms):
    """dweight and dbias sum one term per row: against the sum of the terms' magnitudes, times
    max(1, log2 rows) for the summation order (per-block partials, then the partials)."""
    flat = terms.reshape(-1, terms.shape[-1])
    return flat.abs().sum(0) * max(1.0, math.log2(max(flat.shape[0], 1)))


def problem(x, *rest):
    return (x.numel() // x.shape[-1] if x.shape[-1] else 0, x.shape[-1])


def flat(t):
    return t.view(-1)


# The kernels' views: rows x cols for x, y, dy, dx (the spec's kernel_view); the weight, bias and
# their gradients as they are, (N,); the statistics flat, (rows,)
VIEWS = {"weight": as_is, "bias": as_is, "dweight": as_is, "dbias": as_is, "mean": flat, "rstd": flat}


# Tokens users bring (one decode token to a 32k batch) x hidden sizes of model families (GPT-2's
# 768 to 16k), plus odd ones
SUITE_ROWS = (1, 64, 1024, 8192, 32768)
SUITE_COLS = (768, 1000, 2048, 4096, 5120, 8192, 16384)
SUITE = Suite(cases=tuple(((r, c), d) for d in (torch.float32, torch.bfloat16) for r in SUITE_ROWS
                          for c in SUITE_COLS if r * c <= 2**28),
              rows=("rows", lambda shape, dtype: f"{dtype_label(dtype)} x {shape[0]:,}"),
              cols=("hidden size", lambda shape, dtype: f"{shape[1]:,}"))

# LLM hidden sizes 1k-32k at 4k-32k tokens (the headline range)
HEADLINES = (
    Headline((4096, 1024), (torch.bfloat16,), "short rows: 8 MB, launch- and L2-sensitive"),
    Headline((4096, 4096), (torch.float32, torch.bfloat16)),
    Headline((16384, 8192), (torch.bfloat16,)),
    Headline((32768, 4096), (torch.bfloat16,)),
    Headline((4096, 32768), (torch.bfloat16,), "long rows: 64 KB a row"),
)
SWEEP = tuple((2**26 // 2**k, 2**k) for k in range(8, 16, 1))  # row length 256..32k at 2^26 elements

TEST_SHAPES = (
    (1, 1),  # one element: x - mean is 0 (LayerNorm's y is the bias)
    (3, 7),  # tiny odd rows: every lane but seven masked
    (5, 3000),  # 3000: not a multiple of a 16-byte vector x warp
    (64, 1025),  # one past 1024: a tail of one element
    (2, 3, 777),  # leading dimensions folded into rows; 777 odd
    (300, 4097),  # many rows (several row chunks for the weight's partial sums), one past 4096
    (4800, 4104),  # rows for 12 waves of 512-thread blocks at 3 an SM: step 3's forward without a row ahead
    (4800, 4099),  # the same on the element-wise path (4099: no whole vectors)
    (7, 16384),  # a long row in registers (16 KB+ of fp32 a row)
    (2, 50000),  # longer than any register tile: the steps that loop over a row
    (300, 20001),  # a cluster of 4 over odd rows of 10 a cluster: its last CTA's slice empty, ring refills
    (1600, 24584),  # 12+ waves of 1,024-thread blocks: step 3's forward takes one a row, not a cluster of 4
    (1000, 64),  # many short rows: rows per program, warps per row
    (0, 100),  # zero rows: empty outputs, the weight's gradient zero
)
CPU_SHAPES = ((1, 1), (3, 7), (4, 1025), (2, 3, 33), (40, 8), (0, 5), (3, 4100))  # 4100: past the long-row steps' Min

# The OpSpec fields both norms share
SHARED = dict(kernel_view=rows_view, views=VIEWS, layout="rows", headlines=HEADLINES, sweep=SWEEP,
              sweep_dtype=torch.bfloat16, test_shapes=TEST_SHAPES, cpu_shapes=CPU_SHAPES,
              bounds={"cols": lambda x, *rest: x.shape[-1]}, problem=problem, suite=SUITE, peers=("liger",))
