"""attention: softmax(scale * q k^T + mask) v per batch and head, q (B, H, Sq, D), k and v (B, H, Sk, D),
D = head_dim 64 or 128, bf16/fp16, fp32 accumulation and softmax statistics. causal=1 masks key j
for query i when j > i (top-left aligned, as F.scaled_dot_product_attention's is_causal). The
forward also returns lse = log sum_j exp(scale q_i . k_j) over the unmasked keys (fp32, (B, H, Sq)),
saved for the backward, which recomputes P = exp(scale q k^T - lse) instead of storing it.
Shapes are written (B, H, Sq, Sk, D)."""
import math

import torch

from .spec import HALF, Direction, Headline, OpSpec, Param, Suite, as_is, dtype_label

HEAD_DIMS = (64, 128)
SCALE = 0.125  # 1/sqrt(64): what tests and bench run (the public call's scale=None is 1/sqrt(D))
PARAMS = (Param("causal", int, 0), Param("scale", float, SCALE))
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
QUERY_CHUNK = 1024  # queries per fp64 block of the reference: Sk x 1024 doubles at a time


def check_shapes(label, q, k, v, *rest):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{label}: q, k and v must be 4-D (batch, heads, seq, head_dim), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, sq, d = q.shape
    if k.shape != v.shape or k.shape[:2] != (b, h) or k.shape[3] != d:
        raise ValueError(f"{label}: k and v must be (batch, heads, seq_k, head_dim) with q's batch, heads and "
                         f"head_dim {(b, h, d)}, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if d not in HEAD_DIMS:
        raise ValueError(f"{label}: head_dim must be one of {HEAD_DIMS}, got {d}")
    if k.shape[2] == 0 and q.numel() > 0:
        raise ValueError(f"{label}: attention needs at least one key (k and v have seq_k = 0)")
    if rest:  # the backward: out, lse, dout
        out, lse, dout = rest
        for name, t, shape in (("out", out, q.shape), ("lse", lse, q.shape[:3]), ("dout", dout, q.shape)):
            if t.shape != shape:
                raise ValueError(f"{label}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def make_inputs(shape, dtype, device, gen):
    b, h, sq, sk, d = shape[:5]
    return tuple(torch.randn(dims, generator=gen, dtype=torch.float32, device=device).to(dtype)
                 for dims in ((b, h, sq, d), (b, h, sk, d), (b, h, sk, d)))


def _chunks(q, k, causal, scale):
    """(query slice, fp64 scores of those queries against every key, masked to -inf), per block
    of QUERY_CHUNK queries: the reference never holds Sq x Sk doubles at once."""
    sq, sk = q.shape[2], k.shape[2]
    k64 = k.double()
    for first in range(0, sq, QUERY_CHUNK):
        rows = slice(first, min(first + QUERY_CHUNK, sq))
        s = (q[:, :, rows].double() @ k64.transpose(-1, -2)) * scale
        if causal:
            i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > i, -math.inf)
        yield rows, s


def reference(q, k, v, causal=0, scale=SCALE):
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float64, device=q.device)
    v64 = v.double()
    for rows, s in _chunks(q, k, causal, scale):
        lse[:, :, rows] = torch.logsumexp(s, -1)
        out[:, :, rows] = torch.softmax(s, -1) @ v64
    return out, lse


def out_scale(inputs, ref):
    """Each output element against max_j |v_jd| over its keys: o is a convex mix of v's rows, so
    P's rounding (2^-8 of a weight, summed) moves it by at most that much."""
    v = inputs[2].double()
    return v.abs().amax(2, keepdim=True).expand_as(ref) + torch.finfo(inputs[0].dtype).tiny


def lse_scale(inputs, ref):
    """lse against 1 + |lse|: an fp32 log of an fp32 sum of exponentials of fp32 scores."""
    return 1.0 + ref.abs()


def make_backward_inputs(shape, dtype, device, gen):
    """q, k, v, the forward's out and lse (computed here in fp64, rounded as a step stores them),
    and an upstream gradient."""
    q, k, v = make_inputs(shape, dtype, device, gen)
    out, lse = reference(q, k, v, *shape_params(shape))
    dout = torch.randn(q.shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
    return q, k, v, out.to(dtype), lse.float(), dout


def _backward_terms(q, k, v, out, lse, dout, causal, scale):
    """Per query block: (rows, P, dP, delta) in fp64, P = exp(s - lse) from the given lse."""
    v64, do64 = v.double(), dout.double()
    delta = (do64 * out.double()).sum(-1, keepdim=True)
    for rows, s in _chunks(q, k, causal, scale):
        p = torch.exp(s - lse[:, :, rows].double()[..., None])
        yield rows, p, do64[:, :, rows] @ v64.transpose(-1, -2), delta[:, :, rows]


def backward_reference(q, k, v, out, lse, dout, causal=0, scale=SCALE):
    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    q64, k64, do64 = q.double(), k.double(), dout.double()
    for rows, p, dp, delta in _backward_terms(q, k, v, out, lse, dout, causal, scale):
        ds = p * (dp - delta) * scale
        dq[:, :, rows] = ds @ k64
        dk += ds.transpose(-1, -2) @ q64[:, :, rows]
        dv += p.transpose(-1, -2) @ do64[:, :, rows]
    return dq, dk, dv


def _backward_scales(inputs):
    """Yardsticks of dq, dk, dv: each term's magnitude summed, |dS| = P (|dP| + |delta|) scale."""
    q, k, v, out, lse, dout = inputs
    sq_ = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    sk_ = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    sv_ = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    qa, ka, doa = q.double().abs(), k.double().abs(), dout.double().abs()
    va = v.double().abs()
    # P from the given lse without the mask (the yardstick is not told causal): clamped to 1,
    # which every unmasked weight is, so a masked one only loosens the yardstick
    for rows, p, dp, delta in _backward_terms(q, k, v, out, lse, dout, 0, SCALE):
        p = p.clamp(max=1.0)
        dsa = p * ((doa[:, :, rows] @ va.transpose(-1, -2)) + delta.abs()) * SCALE
        sq_[:, :, rows] = dsa @ ka
        sk_ += dsa.transpose(-1, -2) @ qa[:, :, rows]
        sv_ += p.transpose(-1, -2) @ doa[:, :, rows]
    tiny = torch.finfo(q.dtype).tiny
    return sq_ + tiny, sk_ + tiny, sv_ + tiny


def _sdpa_forward(backend, q, k, v, causal, scale):
    """One backend's aten forward, all it returns: its backward reads its own saved tensors (lse
    in the backend's layout: the efficient kernel pads its rows, cuDNN adds a dimension)."""
    causal = bool(causal)
    if backend == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    if backend == "cudnn":
        return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)


def flash(q, k, v, causal=0, scale=SCALE):
    """SDPA's flash backend (FlashAttention-2) called as the aten op, which returns lse too."""
    return _sdpa_forward("flash", q, k, v, causal, scale)[:2]


def scores(q, k, causal, scale):
    """S = scale q k^T in fp32, causal entries -inf: what the unfused tiers materialize."""
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return s


UNFUSED_MAX_SCORES = 8 * 2**30  # bytes of fp32 S the unfused tier materializes; past it, refused


def refuse_unfused_past_memory(q, k):
    """The unfused tier's declared range: its backward holds about five S x S fp32 tensors at
    once (S, P, dP, dS and a temporary), 80 GiB at one 16k sequence of 16 heads."""
    scores_bytes = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * 4
    if scores_bytes > UNFUSED_MAX_SCORES:
        raise ValueError(f"the unfused formula would materialize {scores_bytes / 2**30:.0f} GiB of fp32 scores "
                         f"(B H Sq Sk x 4 bytes), more than its {UNFUSED_MAX_SCORES // 2**30} GiB range: "
                         "timed at shorter sequences")


def unfused(q, k, v, causal=0, scale=SCALE):
    """The formula as torch ops: S materialized, softmax, P V; with lse for the backward."""
    s = scores(q, k, causal, scale)
    lse = torch.logsumexp(s, -1)
    return (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype), lse


def unfused_backward(q, k, v, out, lse, dout, causal=0, scale=SCALE):
    p = torch.exp(scores(q, k, causal, scale) - lse[..., None])
    dp = dout.float() @ v.float().transpose(-1, -2)
    ds = p * (dp - (dout.float() * out.float()).sum(-1, keepdim=True)) * scale
    return (ds @ k.float()).to(q.dtype), (ds.transpose(-1, -2) @ q.float()).to(q.dtype), \
        (p.transpose(-1, -2) @ dout.float()).to(q.dtype)


def unfused_tier(q, k, v, out, *params):
    refuse_unfused_past_memory(q, k)
    return unfused(q, k, v, *params)


def unfused_backward_tier(q, k, v, out, lse, dout, outs, *params):
    refuse_unfused_past_memory(q, k)
    return unfused_backward(q, k, v, out, lse, dout, *params)


def shape_params(shape):
    """(causal, scale) of a bench shape (B, H, Sq, Sk, D[, causal])."""
    return (shape[5] if len(shape) > 5 else 0), SCALE


def flops(shape):
    """4 B H Sq Sk D (two GEMMs of 2 flops a multiply-add), halved for causal (Sq = Sk)."""
    b, h, sq, sk, d = shape[:5]
    return 4 * b * h * sq * sk * d // (2 if shape_params(shape)[0] else 1)


def io_bytes(shape, dtype):
    b, h, sq, sk, d = shape[:5]
    return (2 * b * h * sq * d + 2 * b * h * sk * d) * dtype.itemsize


def autograd_setup(ctx, inputs, output, params):
    ctx.save_for_backward(*inputs, output[0], output[1])
    ctx.params = params


def autograd_grads(step_ops, ctx, grad, grad_lse=None):
    q, k, v, out, lse = ctx.saved_tensors
    return step_ops.backward(q, k, v, out, lse, grad.to(q.dtype), *ctx.params)


def sdpa_backend(backend):
    """F.scaled_dot_product_attention with one backend forced: (out, lse) through its aten op."""
    def run(q, k, v, out, causal=0, scale=SCALE):
        o, lse = _sdpa_forward(backend, q, k, v, causal, scale)[:2]
        return o, lse.reshape(*q.shape[:2], -1)[..., :q.shape[2]].float()  # some pad lse's rows
    return run


_FLEX = {}


def flex(q, k, v, out, causal=0, scale=SCALE):
    """FlexAttention (torch.compile'd Triton), with a causal block mask where asked."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    mask = None
    if causal:
        key = (q.shape[2], k.shape[2], q.device)
        if key not in _FLEX:
            _FLEX[key] = create_block_mask(lambda b, h, i, j: j <= i, None, None, q.shape[2], k.shape[2],
                                           device=q.device)
        mask = _FLEX[key]
    return _FLEX["fn"](q, k, v, block_mask=mask, scale=scale, return_lse=True)


_FORWARDS = {}


def _sdpa_backward_call(backend, saved, q, k, v, dout, causal, scale):
    """The backend's aten backward on its forward's saved tensors (what autograd would call)."""
    causal = bool(causal)
    if backend == "flash":
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = saved
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale)
    if backend == "cudnn":
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = saved
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal, scale=scale)
    out, lse, seed, offset = saved
    return torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        dout, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale)[:3]


def sdpa_backward(backend):
    """SDPA's backward alone with one backend forced: the backend's forward runs once per input set
    (the bench's warm-up call) and is kept; each call is the backend's aten backward on what that
    forward saved. Called directly, not through torch.autograd.grad: autograd runs a backward
    kernel on its forward's stream, not on the stream a CUDA graph is being captured on, so a
    graph could not hold it (capture failed, and these tiers were timed call by call). A kept
    forward is read by every graph of its shape while the bench times the shape's subjects in
    turns: the forwards of one shape (each backend, each input layout) stay alive until a new
    shape arrives (freeing one while another subject's graph still replays it read freed memory)."""
    def run(q, k, v, out, lse, dout, outs, causal=0, scale=SCALE):
        shape = (q.shape, k.shape, q.dtype, causal, scale)
        key = (backend, q.data_ptr(), k.data_ptr(), v.data_ptr(), shape)
        if key not in _FORWARDS:
            if any(kept[-1] != shape for kept in _FORWARDS):
                _FORWARDS.clear()  # a new shape: the last shape's subjects are done
            _FORWARDS[key] = _sdpa_forward(backend, q, k, v, causal, scale)
        return _sdpa_backward_call(backend, _FORWARDS[key], q, k, v, dout, causal, scale)
    return run


# 16k tokens a batch (the yardstick) at head_dim 128 and 64, causal and not, and short
# sequences. A 6th entry of 1: causal.
HEADLINES = (
    Headline((4, 16, 4096, 4096, 128), HALF),
    Headline((4, 16, 4096, 4096, 128, 1), (torch.bfloat16,), "causal"),
    Headline((1, 16, 16384, 16384, 128, 1), (torch.bfloat16,), "one 16k sequence, causal"),
    Headline((4, 32, 4096, 4096, 64), (torch.bfloat16,), "head_dim 64"),
    Headline((32, 16, 512, 512, 128), (torch.bfloat16,), "short sequences: 512 tokens"),
)

def _suite_cases():
    """~16k tokens a batch over sequence lengths 128-8k (odd ones too), head_dim 64 and 128, causal
    and not; decoding (one query against a long cache) and a prefill chunk against a cache."""
    cases = [((max(1, 16384 // s), 16, s, s, d, c), torch.bfloat16)
             for d in HEAD_DIMS for s in (128, 512, 1000, 2048, 4096, 8192) for c in (0, 1)]
    cases += [((8, 32, 1, 4096, 128), torch.bfloat16), ((1, 32, 1, 16384, 128), torch.bfloat16),
              ((4, 16, 333, 4096, 128), torch.bfloat16), ((4, 16, 1000, 1000, 64, 1), torch.float16)]
    return tuple(cases)


SUITE = Suite(cases=_suite_cases(),
              rows=("head_dim, mask", lambda s, dtype: f"{dtype_label(dtype)} D={s[4]}{' causal' if shape_params(s)[0] else ''}"),
              cols=("Sq x Sk", lambda s, dtype: f"{s[2]}x{s[3]}"))

SPEC = OpSpec(
    name="attention",
    position=9,
    forward=Direction(
        inputs=("q", "k", "v"), outputs=("out", "lse"), params=PARAMS, fixed_dtypes={"lse": torch.float32},
        make_inputs=make_inputs,
        allocate=lambda q, k, v: (torch.empty_like(q, memory_format=torch.contiguous_format),
                                  q.new_empty(q.shape[:3], dtype=torch.float32)),
        reference=reference, error_scale=(out_scale, lse_scale), tolerance=TOLERANCE,
        minimal_bytes=io_bytes, flops=flops,
        torch_eager=lambda q, k, v, out, *params: flash(q, k, v, *params),  # FlashAttention-2
        torch_expr=unfused,
        torch_unfused=unfused_tier,
        more_tiers={"sdpa_cudnn": sdpa_backend("cudnn"), "sdpa_efficient": sdpa_backend("efficient"), "flex": flex},
        shape_params=shape_params,
    ),
    backward=Direction(
        inputs=("q", "k", "v", "out", "lse", "dout"), outputs=("dq", "dk", "dv"), params=PARAMS,
        fixed_dtypes={"lse": torch.float32},
        make_inputs=make_backward_inputs,
        allocate=lambda q, k, v, out, lse, dout: tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                                                       for t in (q, k, v)),
        reference=backward_reference,
        error_scale=tuple((lambda i: lambda inputs, ref: _backward_scales(inputs)[i])(i) for i in range(3)),
        tolerance=TOLERANCE,
        minimal_bytes=lambda shape, dtype: 2 * io_bytes(shape, dtype),  # q k v out dout in; dq dk dv out
        flops=lambda shape: 2.5 * flops(shape),
        torch_eager=sdpa_backward("flash"),
        torch_expr=unfused_backward,
        torch_unfused=unfused_backward_tier,
        more_tiers={"sdpa_cudnn": sdpa_backward("cudnn"), "sdpa_efficient": sdpa_backward("efficient")},
        shape_params=shape_params,
    ),
    autograd=(autograd_setup, autograd_grads),
    saved=("lse",),
    check_shapes=check_shapes,
    kernel_view=lambda *ts: ts,
    views={"lse": as_is},
    dtypes=HALF,
    layout="rows",
    metric="TFLOP/s",
    ceiling="fp32_fma",  # per dtype: half types against the tensor-core peak
    headlines=HEADLINES,
    sweep=tuple((16384 // s, 16, s, s, 128) for s in (512, 2048, 8192, 16384)),  # 16k tokens a batch
    sweep_dtype=torch.bfloat16,
    sweep_tiers=("eager", "sdpa_cudnn", "sdpa_efficient", "flex"),  # not the ~20-40 TFLOP/s unfused ones
    profile_shape=(1, 16, 4096, 4096, 128),  # the first headline's 4 sequences cut to 1: 1 GiB of unfused scores, not 4
    test_shapes=(
        (1, 1, 1, 1, 64),  # one query, one key
        (2, 3, 17, 17, 64),  # 17: one past a 16-row MMA tile
        (1, 2, 1000, 1000, 128),  # no tile divides 1000
        (1, 1, 4097, 300, 64),  # one past 4096 queries against fewer keys
        (1, 2, 65, 8300, 128),  # long keys: CUDA step 4 tiles them by 176 (its ring wraps; ragged last tile)
        (2, 2, 100, 4097, 128),  # few queries, many keys: the KV loop's ragged last tile
        (1, 1, 0, 5, 64),  # no queries: empty outputs
    ),
    cpu_shapes=(
        (1, 1, 1, 1, 64),
        (1, 2, 17, 33, 64),
        (1, 1, 20, 7, 128),
    ),
    suite=SUITE,
    slow_call_ms=60.0,  # the CUDA-core steps take ~0.1-1 s a call at 16k: timed at the shorter sequences
    problem=lambda q, k, v, *rest: (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]),
    bounds={"head_dim": lambda q, *rest: q.shape[-1], "seq_k": lambda q, k, *rest: k.shape[2]},
)
