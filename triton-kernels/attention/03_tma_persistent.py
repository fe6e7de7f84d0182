"""
Step 3 — q, k, v through TMA descriptors, persistent programs
Changed:  q, k, v, dO tiles load through device-side 4-D tensor descriptors (B, H, S, D with
          the tensor's own strides, box 1 x 1 x BLOCK x D) and out, dq, dk, dv leave by TMA
          stores: the copy engine zero-fills rows past this head's S on load and clips them on
          store, so no load or store carries a mask (the diagonal's and the Sk tail's score
          masks stay, as in step 2). The grid is persistent: PER_SM programs per SM (2 for a
          4-warp tile, whose two programs share an SM's registers; 1 for an 8-warp one) walk
          tiles pid, pid + grid, ... in step 2's order; descriptors are built once per program.
          Loop split, tile lists and the two-pass backward are step 2's.
Why:      per 128-key step of a 128-query D = 128 tile, K and V are 64 KB for 8.4 MFLOP (~1.1 us
          of one SM's share of ~990 TFLOP/s): step 2 issues them as 4,096 16-byte cp.async with
          address arithmetic and predicates, on the warps that also run the softmax; TMA
          issues one copy per tile from one thread. Persistence pays program start-up
          (descriptor creation, launch) once per SM instead of once per tile.
          Measured (H200, bf16, 4 x 16 x 4096^2, D = 128, TFLOP/s, step 2 -> 3): forward
          464 -> 453, causal 368 -> 386; backward 369 -> 368, causal 312 -> 278.
Still:    one instruction stream issues the copies, the two wgmma and the softmax: the exp2 of
          block j does not overlap the tensor cores of block j + 1 (FA3's ping-pong needs warp
          specialization). The static round-robin of a persistent grid balances causal tiles
          (unequal work) worse than the hardware's dynamic block scheduler: the causal backward
          (one 255-register program per SM) loses 11% to step 2.
Limits:   TMA needs a 16-byte aligned base and batch, head and row strides that are multiples
          of 16 bytes (any dimension of size 1 excepted) for q, k, v, out and, backward, dO,
          dq, dk, dv; otherwise launch raises ValueError (steps 1 and 2 take any strides; the
          dispatcher's tma_rows layout copies inputs whose rows break the rule). The first call per
          (Sq, Sk, causal, head_dim, dtype) runs the autotuner.
Dtypes:   bfloat16, float16
Layout:   tma_rows
Mirrors:  the CUDA WGMMA/TMA steps (TMA tile loads, persistent tile scheduler), without warp
          specialization
"""
import functools

import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.ops.spec import address
from rosetta.registry import select
from rosetta.torch_ops import triton_module
from rosetta.triton_kernels.attention_common import (LOG2E, attend_keys, backward_delta, check_inputs,
                                                     dkdv_over_queries, dq_over_keys, head_base, load_lse2)
from rosetta.triton_kernels.common import cdiv, quick_bench, sm_count, tuned
from rosetta.triton_kernels.tma import set_descriptor_allocator

# Step 2's loop split and tile lists, imported rather than copied: this step changes the loads,
# the stores and the schedule.
step2 = triton_module(select("attention", "triton", 2))
key_ranges, query_block = step2.key_ranges, step2.query_block


def config(tile, per_sm):
    c = step2.config(*tile)
    c.kwargs["PER_SM"] = per_sm
    return c


def programs_per_sm(tile):
    """Two programs per SM for a 4-warp tile (two fit in the register file at up to 255
    registers a thread, so one's loads overlap the other's math), one for an 8-warp tile: at the
    126-255 registers a thread these tiles take (ptxas), a second program could not be resident
    and would only wait for the first to finish."""
    return 2 if tile[2] == 4 else 1


def configs(table, head_dim, interpret_tile):
    """Step 2's tiles, each with its programs per SM."""
    return tuned([config(c, programs_per_sm(c)) for c in table[head_dim]], config(interpret_tile, 1))


@triton.jit
def head_descriptor(ptr, B, H, S, stride_b, stride_h, stride_s, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A (B, H, S, D) tensor as TMA sees it, in boxes of BLOCK rows of one head: the box's S
    bound is this head's, so rows past S are zero-filled (load) or dropped (store)."""
    return tl.make_tensor_descriptor(ptr, shape=[B, H, S, HEAD_DIM], strides=[stride_b, stride_h, stride_s, 1],
                                     block_shape=[1, 1, BLOCK, HEAD_DIM])


@triton.jit
def attention_tma_kernel(
    q_ptr, k_ptr, v_ptr,  # (B, H, S, D): 16-byte aligned base, strides multiples of 16 bytes
    out_ptr,  # (B, H, Sq, D), q's dtype, likewise
    lse_ptr,  # fp32 (B, H, Sq) contiguous, natural log
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    B, H, Sq, Sk,
    qk_scale,  # scale * log2(e)
    CAUSAL: tl.constexpr,
    POSITIVE_SCALE: tl.constexpr,  # qk_scale > 0: FOLD may apply
    FOLD: tl.constexpr,  # the tile folds the scale into exp2's FFMA (attend_keys), where it may
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PER_SM: tl.constexpr,  # programs per SM (programs_per_sm), read by the grid only; a constexpr, as
    # Inductor's launcher of a compiled graph passes a config's values only as constexprs
):
    q_desc = head_descriptor(q_ptr, B, H, Sq, stride_qb, stride_qh, stride_qs, BLOCK_M, HEAD_DIM)
    k_desc = head_descriptor(k_ptr, B, H, Sk, stride_kb, stride_kh, stride_ks, BLOCK_N, HEAD_DIM)
    v_desc = head_descriptor(v_ptr, B, H, Sk, stride_vb, stride_vh, stride_vs, BLOCK_N, HEAD_DIM)
    o_desc = head_descriptor(out_ptr, B, H, Sq, stride_ob, stride_oh, stride_os, BLOCK_M, HEAD_DIM)
    num_m = tl.cdiv(Sq, BLOCK_M)
    for tile in tl.range(tl.program_id(0), B * H * num_m, tl.num_programs(0)):
        bh, block = query_block(tile, num_m, CAUSAL)
        b = bh // H
        h = bh % H
        start_m = block * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        mid, hi = key_ranges(start_m, Sk, CAUSAL, BLOCK_M, BLOCK_N)
        # (strides 0: unused with descriptors; False/True: unmasked, then masked; True: TMA)
        acc, l_i, m_i = attend_keys(acc, l_i, m_i, q, offs_m, k_desc, v_desc, b, h, 0, 0, 0, mid, Sk, qk_scale,
                                    CAUSAL, False, True, BLOCK_N, HEAD_DIM, FOLD and POSITIVE_SCALE)
        acc, l_i, m_i = attend_keys(acc, l_i, m_i, q, offs_m, k_desc, v_desc, b, h, 0, 0, mid, hi, Sk, qk_scale,
                                    CAUSAL, True, True, BLOCK_N, HEAD_DIM, FOLD and POSITIVE_SCALE)
        o = (acc / l_i[:, None]).to(out_ptr.dtype.element_ty)
        o_desc.store([b, h, start_m, 0], o.reshape(1, 1, BLOCK_M, HEAD_DIM))  # rows past Sq clipped
        tl.store(lse_ptr + bh.to(tl.int64) * Sq + offs_m, (m_i + tl.math.log2(l_i)) * 0.6931471805599453,
                 mask=offs_m < Sq)


@triton.jit
def attention_tma_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,  # as the forward's inputs; dO like q
    lse_ptr,  # fp32 (B, H, Sq), unit last stride, natural log
    delta_ptr,  # fp32 (B, H, Sq) contiguous: rowsum(dO O)
    dk_ptr, dv_ptr,  # (B, H, Sk, D), q's dtype, TMA-describable
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks,
    stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh,
    B, H, Sq, Sk,
    qk_scale, scale,
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per loop step
    BLOCK_N: tl.constexpr,  # keys per tile
    PER_SM: tl.constexpr,  # as the forward's
):
    q_desc = head_descriptor(q_ptr, B, H, Sq, stride_qb, stride_qh, stride_qs, BLOCK_M, HEAD_DIM)
    do_desc = head_descriptor(do_ptr, B, H, Sq, stride_dob, stride_doh, stride_dos, BLOCK_M, HEAD_DIM)
    k_desc = head_descriptor(k_ptr, B, H, Sk, stride_kb, stride_kh, stride_ks, BLOCK_N, HEAD_DIM)
    v_desc = head_descriptor(v_ptr, B, H, Sk, stride_vb, stride_vh, stride_vs, BLOCK_N, HEAD_DIM)
    dk_desc = head_descriptor(dk_ptr, B, H, Sk, stride_dkb, stride_dkh, stride_dks, BLOCK_N, HEAD_DIM)
    dv_desc = head_descriptor(dv_ptr, B, H, Sk, stride_dvb, stride_dvh, stride_dvs, BLOCK_N, HEAD_DIM)
    num_n = tl.cdiv(Sk, BLOCK_N)
    full_m = (Sq // BLOCK_M) * BLOCK_M
    for tile in tl.range(tl.program_id(0), B * H * num_n, tl.num_programs(0)):
        bh = tile // num_n
        b = bh // H
        h = bh % H
        start_n = (tile % num_n) * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = k_desc.load([b, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([b, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        lse_bh = head_base(lse_ptr, bh, H, stride_lb, stride_lh)
        delta_bh = delta_ptr + bh.to(tl.int64) * Sq
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        # step 2's three query ranges: diagonal (masked), inside (unmasked), ragged tail (masked)
        if CAUSAL:
            lo = start_n // BLOCK_M * BLOCK_M
            mid = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, tl.cdiv(Sq, BLOCK_M) * BLOCK_M)
        else:
            lo = 0
            mid = 0
        dk, dv = dkdv_over_queries(dk, dv, k, v, offs_n, q_desc, do_desc, b, h, lse_bh, delta_bh, 0, 0,
                                   lo, mid, Sq, qk_scale, CAUSAL, True, True, BLOCK_M, HEAD_DIM)
        dk, dv = dkdv_over_queries(dk, dv, k, v, offs_n, q_desc, do_desc, b, h, lse_bh, delta_bh, 0, 0,
                                   mid, full_m, Sq, qk_scale, CAUSAL, False, True, BLOCK_M, HEAD_DIM)
        dk, dv = dkdv_over_queries(dk, dv, k, v, offs_n, q_desc, do_desc, b, h, lse_bh, delta_bh, 0, 0,
                                   tl.maximum(mid, full_m), Sq, Sq, qk_scale, CAUSAL, True, True, BLOCK_M, HEAD_DIM)
        dk_desc.store([b, h, start_n, 0], (dk * scale).to(dk_ptr.dtype.element_ty).reshape(1, 1, BLOCK_N, HEAD_DIM))
        dv_desc.store([b, h, start_n, 0], dv.to(dv_ptr.dtype.element_ty).reshape(1, 1, BLOCK_N, HEAD_DIM))


@triton.jit
def attention_tma_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,  # as attention_tma_dkdv_kernel
    dq_ptr,  # (B, H, Sq, D), q's dtype, TMA-describable
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_dqb, stride_dqh, stride_dqs,
    stride_lb, stride_lh,
    B, H, Sq, Sk,
    qk_scale, scale,
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per tile
    BLOCK_N: tl.constexpr,  # keys per loop step
    PER_SM: tl.constexpr,  # as the forward's
):
    q_desc = head_descriptor(q_ptr, B, H, Sq, stride_qb, stride_qh, stride_qs, BLOCK_M, HEAD_DIM)
    do_desc = head_descriptor(do_ptr, B, H, Sq, stride_dob, stride_doh, stride_dos, BLOCK_M, HEAD_DIM)
    k_desc = head_descriptor(k_ptr, B, H, Sk, stride_kb, stride_kh, stride_ks, BLOCK_N, HEAD_DIM)
    v_desc = head_descriptor(v_ptr, B, H, Sk, stride_vb, stride_vh, stride_vs, BLOCK_N, HEAD_DIM)
    dq_desc = head_descriptor(dq_ptr, B, H, Sq, stride_dqb, stride_dqh, stride_dqs, BLOCK_M, HEAD_DIM)
    num_m = tl.cdiv(Sq, BLOCK_M)
    for tile in tl.range(tl.program_id(0), B * H * num_m, tl.num_programs(0)):
        bh, block = query_block(tile, num_m, CAUSAL)
        b = bh // H
        h = bh % H
        start_m = block * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = q_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        do = do_desc.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        # padded rows: lse 0 and delta 0 with q = dO = 0 (TMA's fill) give dS = 0; clipped on store
        lse2 = load_lse2(head_base(lse_ptr, bh, H, stride_lb, stride_lh), offs_m, Sq, True)
        delta = tl.load(delta_ptr + bh.to(tl.int64) * Sq + offs_m, mask=offs_m < Sq, other=0.0)
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        mid, hi = key_ranges(start_m, Sk, CAUSAL, BLOCK_M, BLOCK_N)
        dq = dq_over_keys(dq, q, do, lse2, delta, offs_m, k_desc, v_desc, b, h, 0, 0, 0, mid, Sk, qk_scale,
                          CAUSAL, False, True, BLOCK_N, HEAD_DIM)
        dq = dq_over_keys(dq, q, do, lse2, delta, offs_m, k_desc, v_desc, b, h, 0, 0, mid, hi, Sk, qk_scale,
                          CAUSAL, True, True, BLOCK_N, HEAD_DIM)
        dq_desc.store([b, h, start_m, 0], (dq * scale).to(dq_ptr.dtype.element_ty).reshape(1, 1, BLOCK_M, HEAD_DIM))


def tuned_kernel(kernel, head_dim):
    """The kernel under its autotuner for this head_dim (a SymInt while torch traces with dynamic
    shapes: the tile tables are per head_dim, so the trace specializes on it)."""
    return _tuned_kernel(kernel, int(head_dim))


@functools.cache
def _tuned_kernel(kernel, head_dim):
    table = {attention_tma_kernel: step2.FORWARD_CONFIGS, attention_tma_dkdv_kernel: step2.DKDV_CONFIGS,
             attention_tma_dq_kernel: step2.DQ_CONFIGS}[kernel]
    interpret = step2.INTERPRET_FORWARD_TILE if kernel is attention_tma_kernel else step2.INTERPRET_TILE
    return triton.autotune(configs=configs(table, head_dim, interpret), key=step2.KEY, do_bench=quick_bench)(kernel)


def tma_strides(step, named):
    """(batch, head, row) strides of each tensor as its descriptor takes them, after TMA's rules:
    16-byte aligned base and strides that are nonzero multiples of 16 bytes. A dimension of size 1
    is never stepped along, so its stride is replaced by an aligned one (D elements)."""
    out = []
    for name, t in named:
        strides = tuple(s if n > 1 else t.shape[-1] for n, s in zip(t.shape[:3], t.stride()[:3]))
        if address(t) % 16 or any(s <= 0 or (s * t.element_size()) % 16 for s in strides):
            raise ValueError(
                f"attention step {step} loads through TMA and needs {name} with a 16-byte aligned base and "
                f"batch, head and row strides that are positive multiples of 16 bytes; got {name} of shape "
                f"{tuple(t.shape)}, strides {t.stride()}, address % 16 = {address(t) % 16}. Steps 1 and 2 "
                f"take any strides.")
        out.extend(strides)
    return out


def programs(device, tiles):
    """The persistent grid: PER_SM programs per SM, never more than there are tiles."""
    num_sms = sm_count(device)
    return lambda meta: (min(tiles(meta), num_sms * meta["PER_SM"]),)


def launch(q, k, v, out, lse, causal, scale):
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if B * H * Sq == 0:
        return
    check_inputs("attention step 3", q, k, v)
    strides = tma_strides(3, (("q", q), ("k", k), ("v", v), ("out", out)))
    set_descriptor_allocator(q.device)
    grid = programs(q.device, lambda meta: B * H * cdiv(Sq, meta["BLOCK_M"]))
    wrap_triton(tuned_kernel(attention_tma_kernel, D))[grid](
        q, k, v, out, lse, *strides, B, H, Sq, Sk, scale * LOG2E, CAUSAL=bool(causal), POSITIVE_SCALE=bool(scale > 0),
        HEAD_DIM=D)


def launch_backward(q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if B * H * Sk == 0:
        return
    if Sq == 0:
        dk.zero_()  # sums over no queries
        dv.zero_()
        return
    check_inputs("attention step 3", q, k, v, out, lse, dout)
    qkv = tma_strides(3, (("q", q), ("k", k), ("v", v), ("dout", dout)))
    set_descriptor_allocator(q.device)
    delta = backward_delta(out, dout)
    tail = (*lse.stride()[:2], B, H, Sq, Sk, scale * LOG2E, scale)
    wrap_triton(tuned_kernel(attention_tma_dkdv_kernel, D))[
        programs(q.device, lambda meta: B * H * cdiv(Sk, meta["BLOCK_N"]))](
        q, k, v, dout, lse, delta, dk, dv, *qkv, *tma_strides(3, (("dk", dk), ("dv", dv))), *tail,
        CAUSAL=bool(causal), HEAD_DIM=D)
    wrap_triton(tuned_kernel(attention_tma_dq_kernel, D))[
        programs(q.device, lambda meta: B * H * cdiv(Sq, meta["BLOCK_M"]))](
        q, k, v, dout, lse, delta, dq, *qkv, *tma_strides(3, (("dq", dq),)), *tail,
        CAUSAL=bool(causal), HEAD_DIM=D)
