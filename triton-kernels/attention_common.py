"""What the Triton attention steps share: the host-side checks and head addressing, the inner
loops of FlashAttention (forward over a range of key blocks; backward dK/dV over a range of query
blocks and dQ over a range of key blocks) and the backward's preprocess (delta = rowsum(dO * O)).

Each inner loop takes a MASKED flag. Step 1 runs every block with MASKED=True (ragged tails and
the causal diagonal handled by one where() per block); step 2 splits a program's range into the
blocks that need no mask (fully inside the sequence and fully below the diagonal) and the few
that do, so most blocks skip the compare-and-select on the BLOCK_M x BLOCK_N score tile. A TMA
flag (step 3) swaps the pointer loads for tensor-descriptor loads (load_tile).

Scores are kept in base 2: qk_scale = scale * log2(e), so exp(scale * s) = exp2(qk_scale * s)
(one MUFU.EX2 per element, no extra multiply); lse is stored in natural log (the spec's) and
turned back into base 2 (lse * log2(e)) where the backward reads it."""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
HEAD_DIMS = (64, 128)


def check_inputs(step: str, *tensors):
    """The kernels read rows (and lse) with unit stride and take any other strides; head_dim is a
    constexpr tile width (the spec's 64 or 128). Raised before any launch."""
    for t in tensors:
        if t.dim() == 4 and t.shape[-1] not in HEAD_DIMS:
            raise ValueError(f"{step}: head_dim must be one of {HEAD_DIMS}, got {t.shape[-1]}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{step}: needs a unit stride along head_dim, got strides {t.stride()}")


def head_strides(t):
    """(batch, head, row) strides in elements: any of them may be anything (q may be a transposed
    (B, S, H, D) tensor); the last dimension has unit stride."""
    return t.stride(0), t.stride(1), t.stride(2)


def row_offsets_fit_32(*tensors, pad=256):
    """True when every row offset inside a head of each (B, H, S, D) tensor, padding rows of a
    ragged last tile included (pad), fits a signed 32-bit integer: the loops may then address a
    tile with 32-bit offsets from the head's 64-bit base (ROWS32 in load_rows)."""
    return all((t.shape[2] + pad) * max(t.stride(2), t.shape[3]) < 2**31 for t in tensors)


@triton.jit
def head_base(ptr, bh, H, stride_b, stride_h):
    """Pointer to head (b, h) = divmod(bh, H) of a (B, H, S, D) tensor; 64-bit: b * stride_b
    passes 2^31 elements on big inputs."""
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    return ptr + b * stride_b + h * stride_h


@triton.jit
def load_rows(base, rows, stride_s, offs_d, n, MASKED: tl.constexpr, ROWS32: tl.constexpr = False):
    """A (len(rows), D) tile of one head; rows past n read as 0 when MASKED (unmasked callers
    pass only rows < n). Row offsets in 64 bits: rows * stride_s passes 2^31 for long sequences
    of a strided (B, S, H, D) tensor. ROWS32 (the host checked that every row offset inside the
    head fits 31 bits, row_offsets_fit_32): one 32-bit offset a element, added to the 64-bit base,
    as Flex's loads are; the 64-bit multiply-adds cost ~50 of the ~400 instructions of step 2's
    D = 128 loop (SASS)."""
    if ROWS32:
        ptrs = base + (rows[:, None] * stride_s + offs_d[None, :])
    else:
        ptrs = base + rows[:, None].to(tl.int64) * stride_s + offs_d[None, :]
    if MASKED:
        return tl.load(ptrs, mask=rows[:, None] < n, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def load_tile(src, b, h, start, stride_s, n, MASKED: tl.constexpr, TMA: tl.constexpr, BLOCK: tl.constexpr,
              HEAD_DIM: tl.constexpr, ROWS32: tl.constexpr = False):
    """Rows [start, start + BLOCK) of head (b, h). TMA: src is a 4-D (B, H, S, D) tensor descriptor
    (step 3) and the copy engine zero-fills rows past S of this head, so MASKED needs no mask;
    else src is the head's base pointer (head_base), b and h are unused, and ROWS32 is load_rows'."""
    if TMA:
        return src.load([b, h, start, 0]).reshape(BLOCK, HEAD_DIM)
    else:
        return load_rows(src, start + tl.arange(0, BLOCK), stride_s, tl.arange(0, HEAD_DIM), n, MASKED, ROWS32)


@triton.jit
def load_lse2(lse_bh, rows, n, MASKED: tl.constexpr):
    """lse of rows (natural log, unit stride from lse_bh) in base 2, to subtract from base-2
    scores; padded rows (MASKED, rows >= n) read 0."""
    if MASKED:
        lse = tl.load(lse_bh + rows, mask=rows < n, other=0.0)
    else:
        lse = tl.load(lse_bh + rows)
    return lse * 1.4426950408889634


@triton.jit
def attend_keys(acc, l_i, m_i, q, offs_m, k_src, v_src, b, h, stride_ks, stride_vs, lo, hi, Sk, qk_scale,
                CAUSAL: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr, BLOCK_N: tl.constexpr,
                HEAD_DIM: tl.constexpr, FOLD: tl.constexpr = False, ROWS32: tl.constexpr = False):
    """The online softmax over key blocks [lo, hi) for the BLOCK_M queries offs_m (q in registers;
    k_src, v_src: head base pointers, or descriptors with coordinates b, h, see load_tile):
    per block S = q k^T (tensor cores, fp32), running row max m (base 2), running sum l and the
    accumulator rescaled by exp2(m_old - m_new) whenever m grows, then acc += P v with P rounded
    to the input dtype (what the second tl.dot takes). MASKED: keys past Sk and, if CAUSAL, keys
    after the query (j > i) get -inf before the max. The caller's first block always holds key 0,
    unmasked for every row, so m is finite from the first block on (no -inf - -inf = NaN).
    FOLD (callers pass qk_scale > 0): the scale rides in the exponent. For k > 0, max(k s) =
    k max(s), so the max is taken on raw scores and P = exp2(k s - m) is one FFMA a score: the
    separate multiply of the whole tile by k is gone (masked scores are -inf either way)."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when Inductor launches (it types Python floats so)
    exp_scale = qk_scale if FOLD else 1.0  # what the exponent multiplies the scores in s by
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_src, b, h, start_n, stride_ks, Sk, MASKED, TMA, BLOCK_N, HEAD_DIM, ROWS32)
        s = tl.dot(q, tl.trans(k))
        if not FOLD:
            s = s * qk_scale
        if MASKED:
            keep = cols[None, :] < Sk
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * exp_scale)
        p = tl.math.exp2(s * exp_scale - m_new[:, None])  # one FFMA and one MUFU.EX2 a score
        alpha = tl.math.exp2(m_i - m_new)  # 0 on the first block (m_i = -inf), < 1 when m grows
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_tile(v_src, b, h, start_n, stride_vs, Sk, MASKED, TMA, BLOCK_N, HEAD_DIM, ROWS32)  # padded keys: 0 * 0
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def dkdv_over_queries(dk, dv, k, v, offs_n, q_src, do_src, b, h, lse_bh, delta_bh, stride_qs, stride_dos,
                      lo, hi, Sq, qk_scale, CAUSAL: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
                      BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS32: tl.constexpr = False):
    """dK and dV of the BLOCK_N keys offs_n (k, v in registers; q_src, do_src as load_tile takes
    them; lse_bh, delta_bh: this head's unit-stride rows) over query blocks [lo, hi), in the
    transposed orientation (keys down, queries across) so no tile is transposed in registers:
    P^T = exp2(qk_scale k q^T - lse2), dV += P^T dO, dP^T = v dO^T, dS^T = P^T (dP^T - delta),
    dK += dS^T q (times scale, applied once by the caller). MASKED: query rows past Sq and, if
    CAUSAL, pairs with key j > query i get P = 0; their q and dO rows read as 0."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when Inductor launches (it types Python floats so)
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        q = load_tile(q_src, b, h, start_m, stride_qs, Sq, MASKED, TMA, BLOCK_M, HEAD_DIM, ROWS32)
        do = load_tile(do_src, b, h, start_m, stride_dos, Sq, MASKED, TMA, BLOCK_M, HEAD_DIM, ROWS32)
        lse2 = load_lse2(lse_bh, rows, Sq, MASKED)
        if MASKED:
            delta = tl.load(delta_bh + rows, mask=rows < Sq, other=0.0)
        else:
            delta = tl.load(delta_bh + rows)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        if MASKED:
            # where, not a -inf score: a padded query row has lse 0, and exp2(0) must not reach dV
            keep = rows[None, :] < Sq
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def dq_over_keys(dq, q, do, lse2, delta, offs_m, k_src, v_src, b, h, stride_ks, stride_vs, lo, hi, Sk, qk_scale,
                 CAUSAL: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, ROWS32: tl.constexpr = False):
    """dQ of the BLOCK_M queries offs_m (q, dO, lse2, delta in registers) over key blocks [lo, hi):
    P recomputed, dS = P (dO v^T - delta), dQ += dS k (times scale, applied once by the caller).
    MASKED: keys past Sk (read as 0, so their score would be 0, not -inf) and, if CAUSAL, keys
    after the query get P = 0."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when Inductor launches (it types Python floats so)
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_src, b, h, start_n, stride_ks, Sk, MASKED, TMA, BLOCK_N, HEAD_DIM, ROWS32)
        v = load_tile(v_src, b, h, start_n, stride_vs, Sk, MASKED, TMA, BLOCK_N, HEAD_DIM, ROWS32)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            keep = cols[None, :] < Sk
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def attention_delta_kernel(
    out_ptr,  # forward output O, (B, H, Sq, D), unit last stride
    do_ptr,  # upstream gradient dO, (B, H, Sq, D), unit last stride
    delta_ptr,  # fp32 (B * H, Sq) scratch: delta_i = sum_d dO_id O_id
    stride_ob, stride_oh, stride_os,
    stride_dob, stride_doh, stride_dos,
    H, Sq,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per program
):
    """delta_i = rowsum(dO * O) = sum_j P_ij dP_ij: the term every dS_ij = P_ij (dP_ij - delta_i)
    subtracts, computed once per row (2 x D reads) instead of once per key block."""
    num_m = tl.cdiv(Sq, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // num_m
    rows = (pid % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    o = load_rows(head_base(out_ptr, bh, H, stride_ob, stride_oh), rows, stride_os, offs_d, Sq, True)
    do = load_rows(head_base(do_ptr, bh, H, stride_dob, stride_doh), rows, stride_dos, offs_d, Sq, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + bh.to(tl.int64) * Sq + rows, delta, mask=rows < Sq)


def backward_delta(out, dout, block_m=64):
    """delta = rowsum(dO * O) into a new fp32 (B, H, Sq) scratch (every element written)."""
    B, H, Sq, D = out.shape
    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=out.device)
    grid = (B * H * cdiv(Sq, block_m),)
    wrap_triton(attention_delta_kernel)[grid](out, dout, delta, *head_strides(out), *head_strides(dout), H, Sq,
                                              HEAD_DIM=D, BLOCK_M=block_m, num_warps=4)
    return delta
