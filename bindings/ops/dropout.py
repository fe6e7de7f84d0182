"""dropout: y = x * scale where the element is kept, else 0; scale = 1 / (1 - p) rounded once to
fp32; no mask is stored: the backward regenerates it from (seed, offset). The mask is Triton's own
generator, Philox4x32-10, the same in both backends, bit for bit: element i of the flat tensor is
kept when word i % 4 of tl.randint4x(seed, offset + i // 4), made uniform in [0, 1) as tl.rand
does, is greater than p (in fp32). Differentiable: dx is dy through the same mask and scale."""
import math

import torch

from .spec import ALL_FLOAT, Direction, Headline, OpSpec, Param, Suite, dtype_label

P, SEED, OFFSET = 0.1, 1234, 0  # what tests and bench run
PARAMS = (Param("p", float, P), Param("seed", int, SEED), Param("offset", int, OFFSET))
WORD = 0xFFFFFFFF
# x * scale rounded to the output type (a dropped element must be exactly 0; a wrong mask is off by
# the whole value, far past these)
TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
ROUND_A, ROUND_B, KEY_A, KEY_B = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def philox4x32(counter: torch.Tensor, seed: int, rounds: int = 10) -> tuple:
    """The four 32-bit words of Philox4x32 for each int64 `counter` (c0 its low word, c1 its high
    word, c2 = c3 = 0) under the 64-bit `seed` (k0 low, k1 high), as Triton's randint4x: written
    here from the algorithm in int64 tensors holding 32-bit words, so the kernels are checked
    against an implementation that is not theirs. A 64-bit product wraps; its bits 32-63 are the
    multiply-high."""
    c0, c1 = counter & WORD, (counter >> 32) & WORD
    c2 = c3 = torch.zeros_like(counter)
    k0, k1 = seed & WORD, (seed >> 32) & WORD
    for _ in range(rounds):
        p0, p2 = ROUND_B * c2, ROUND_A * c0  # wrapping int64 products of 32-bit words
        c0, c2, c1, c3 = ((p0 >> 32) & WORD) ^ c1 ^ k0, ((p2 >> 32) & WORD) ^ c3 ^ k1, p0 & WORD, p2 & WORD
        k0, k1 = (k0 + KEY_A) & WORD, (k1 + KEY_B) & WORD
    return c0, c1, c2, c3


def uniform(words: torch.Tensor) -> torch.Tensor:
    """tl.rand's uint -> float in [0, 1): the word as an int32, negatives folded (-x - 1), times
    4.6566127342e-10 in fp32."""
    signed = torch.where(words >= 2**31, words - 2**32, words)
    folded = torch.where(signed < 0, -signed - 1, signed)
    return folded.to(torch.float32) * torch.tensor(4.6566127342e-10, dtype=torch.float32)


def keep_mask(n: int, p: float, seed: int, offset: int, device) -> torch.Tensor:
    """Element 4g + k is kept when word k of Philox at counter offset + g, made uniform, is > p:
    the four words of a counter, in order, are four consecutive elements. Drawn 2^22 counters at a
    time (int64 temporaries of ~0.2 GB, not tens of GB at 2^28 elements)."""
    groups, chunk = -(-n // 4), 2**22
    threshold = torch.tensor(p, dtype=torch.float32)
    parts = []
    for first in range(0, groups, chunk):
        g = torch.arange(first, min(first + chunk, groups), dtype=torch.int64, device=device)
        words = torch.stack(philox4x32(offset + g, seed), -1).view(-1)  # (counters * 4,), element order
        parts.append(uniform(words) > threshold.to(device))
    return torch.cat(parts)[:n] if parts else torch.zeros(0, dtype=torch.bool, device=device)


def reference(x, p=P, seed=SEED, offset=OFFSET):
    keep = keep_mask(x.numel(), p, seed, offset, x.device).view(x.shape)
    return torch.where(keep, x.double() / (1.0 - p) if p < 1 else 0.0, 0.0)


def make_inputs(shape, dtype, device, gen):
    return (torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype),)


def error_scale(inputs, ref):
    """Relative to each kept value (a dropped one must be exactly 0: its scale is the floor)."""
    return ref.abs() + torch.finfo(inputs[0].dtype).tiny


def autograd_setup(ctx, inputs, output, params):
    ctx.params = params


def autograd_grads(step_ops, ctx, grad):
    return (step_ops.backward(grad, *ctx.params),)


def torch_dropout(x, out):
    """torch's own dropout (its generator, not ours: judged by `tier_error`), which also writes
    the mask it keeps for the backward: a byte per element."""
    return torch.ops.aten.native_dropout(x, P, True)[0]


_MASKS: dict = {}


def torch_dropout_backward(dy, out):
    """torch's dropout backward: dy times the byte mask its forward kept, and the scale. The mask
    is made once per shape, before the timing (the first call is the bench's warm-up)."""
    key = (dy.shape, dy.device)
    if key not in _MASKS:
        _MASKS[key] = torch.ops.aten.native_dropout(torch.ones_like(dy), P, True)[1]
    return torch.ops.aten.native_dropout_backward(dy, _MASKS[key], 1.0 / (1.0 - P))


def tier_error(inputs, out) -> float:
    """A tier with its own generator (torch's dropout) cannot match the mask: it passes when every
    element is 0 or x * scale (to the output's rounding) and the kept share is within 4 sigma of
    1 - p. Returns 0 or inf, like an error over the tolerance."""
    (x,) = inputs
    y = out[0] if isinstance(out, tuple) else out
    kept = y != 0
    n = x.numel()
    share_ok = n == 0 or abs(kept.double().mean().item() - (1 - P)) <= 4 * math.sqrt(P * (1 - P) / n) + 1 / n
    scaled = x.double() / (1 - P)
    # to the output's rounding; a subnormal (fp16 has many below 6e-5) to its smallest normal
    values_ok = bool(((y.double() - scaled).abs() <= 1e-2 * scaled.abs() + torch.finfo(x.dtype).tiny)[kept].all())
    return 0.0 if share_ok and values_ok else math.inf


DIRECTION = dict(make_inputs=make_inputs, allocate=lambda t: torch.empty_like(t, memory_format=torch.contiguous_format),
                 reference=reference, error_scale=error_scale, tolerance=TOLERANCE,
                 minimal_bytes=lambda shape, dtype: 2 * math.prod(shape) * dtype.itemsize,  # 1 read + 1 write
                 flops=lambda shape: math.prod(shape), params=PARAMS, tier_error=tier_error)

SUITE_SIZES = (2**10, 10_007, 2**16, 1_000_003, 2**22, 2**24, 2**26, 2**28)
SPEC = OpSpec(
    name="dropout",
    position=7,
    forward=Direction(inputs=("x",), outputs=("y",), torch_eager=torch_dropout,
                      torch_expr=lambda x: torch.nn.functional.dropout(x, P, training=True), **DIRECTION),
    backward=Direction(inputs=("dy",), outputs=("dx",), torch_eager=torch_dropout_backward,
                       torch_expr=lambda dy: torch.nn.functional.dropout(dy, P, training=True), **DIRECTION),
    autograd=(autograd_setup, autograd_grads),
    check_shapes=lambda label, *tensors: None,  # any shape: every element is its own
    kernel_view=lambda *ts: tuple(t.view(-1) for t in ts),  # contiguous: a free view
    layout="contiguous",
    headlines=(Headline((2**28,), ALL_FLOAT),),
    sweep=tuple((2**k,) for k in range(12, 29, 4)),
    sweep_dtype=torch.bfloat16,
    problem=lambda x, *rest: (x.numel(),),
    suite=Suite(cases=tuple(((n,), d) for d in (torch.float32, torch.bfloat16) for n in SUITE_SIZES),
                rows=("dtype", lambda shape, dtype: dtype_label(dtype)),
                cols=("elements", lambda shape, dtype: f"{shape[0]:,}")),
    test_shapes=(
        (0,),  # empty: no launch
        (1,),  # one element: a group of four with three past the end
        (7,),  # a group of four, then three: the last group ragged
        (1025,),  # one past a block of 1024
        (3, 1001),  # 2-D: the flat index runs across rows
        (2**20 + 3,),  # many programs, a ragged tail
        # not the 2^28 headline: the bench checks it against fp64 on every run, and here 8 test
        # workers holding its fp64 copies at once ran the GPU out of memory
    ),
    cpu_shapes=((0,), (1,), (7,), (1025,), (3, 33)),
)
