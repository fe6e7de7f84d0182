"""
Step 8 — small M: a stream of B's rows, rank-1 updates on the CUDA cores (no tl.dot)
Changed:  for M <= 8 the program owns a strip of BLOCK_N columns of B and a slice of K, and
          adds one rank-1 update per row of B: acc (M_PAD x BLOCK_N, fp32) += a[:, k] (a column
          of A, M_PAD values) x b[k, :] (a row of B). The BLOCK_K = 16 rows of a step are a
          tl.static_range, unrolled, so their loads are all issued before the first multiply;
          B's rows load with evict_first (read once). Each thread holds 16 bytes of a row, as
          CUDA step 15's lanes do. With K
          split over programs, each program stores its fp32 partial strip, then takes a ticket
          (tl.atomic_add, acq_rel at GPU scope, after a barrier so the whole program's stores
          are ordered before it); the program holding the last ticket adds the slices in the
          order 0, 1, 2, ... and stores the output: one kernel, deterministic -- step 7's
          "Still:" asked for the in-kernel fix-up.
Why:      at M <= 8 a GEMM is a read of B (1 x 4096 x 4096 bf16: 33.5 MB for 33.5 Mflop): the
          tensor cores have nothing to do, and tl.dot pads M to 16 rows (steps 4 and 7), the
          least mma.sync takes. What matters is bytes in flight on every SM: the split is chosen
          for ~4 programs per SM, slices of >= 32 rows, partials under 1/8 of B's bytes.
          16 rows a step and up to 128 slices, against 8 and 64 (bench/ablations/matmul_small_m.py,
          H100, bf16): 4 x 4096 x 4096 74.3 -> 37.6 us, 8 x 4096 x 4096 95.7 -> 73.1, 1 x 768 x
          3072 26.5 -> 16.9: more of B in flight a thread, and short K split finer.
          Mirrors step 1's rank-1 updates, now the right tool: at M <= 8 an outer product
          per row of B is exactly the work, with no shared-memory tile to fill.
Still:    slower than step 7's split-K on tl.dot at nearly every shape measured (8 x 4096 x
          4096: 73.1 against 19.6 us): a[:, k] is built as an (M_PAD, 1) tile from M_PAD scalar
          loads (L1 hits, but instructions; CUDA step 15 reads it from shared memory) and selects
          per row of B, and the rank-1 update is M_PAD x BLOCK_N FFMAs a row where tl.dot's
          16-row minimum costs nearly nothing; 32 rows a step help one row (28.5 us at 1 x 4096 x
          4096) and hurt eight (99.6). Tickets need zeros in memory before every launch (a small
          torch.zeros, one more launch); a column-major B (a weight (out, in) used as W.t())
          would need the dot-product form of a GEMV and is refused (`b_column_major`), left to
          steps 4-7, which read it as it is; M = 5-7 multiply 8 rows.
Limits:   M <= 8 (`m_rows`), B row-major (`b_column_major`): others are refused before launch.
          A and B need their last stride 1 (the dispatcher copies A otherwise).
Dtypes:   float32, float16, bfloat16
Layout:   rows
Max:      m_rows <= 8; b_column_major <= 0
Mirrors:  CUDA step 15 (GEMV-style small M)
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import INTERPRET, cdiv, next_power_of_2, sm_count

NUM_WARPS = 4
BLOCK_K = 16  # rows of B per unrolled step: 16 loads in flight per thread
MIN_SLICE = 32  # K rows per program at least
MAX_SPLIT = 128
PROGRAMS_PER_SM = 4  # 4-warp programs: two per SM measured a third slower at 1 x 4096 x 14336 bf16
INTERPRET_SPLIT = 3  # under the interpreter: split whenever K allows, so the CPU tests run the fix-up


@triton.jit
def gemv_kernel(a_ptr, b_ptr, out_ptr, part_ptr, ticket_ptr, M, N, K, stride_am, stride_bk, SLICE, SLICE_SIZE,
                M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    strip = tl.program_id(0)
    z = tl.program_id(1)
    splits = tl.num_programs(1)
    cols = strip * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, M_PAD)
    col_ok = cols < N
    row_ok = rows < M
    k_begin = z * SLICE
    k_end = tl.minimum(K, k_begin + SLICE)
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    # Layouts: B's row is loaded as a (1, BLOCK_N) tile and a[:, k] is built as an (M_PAD, 1) tile,
    # so both broadcast into acc's 2-D layout as they are. (A 1-D row and a 1-D column, expanded
    # inside the loop, took layouts of their own: a conversion through shared memory per k.)
    for k0 in range(k_begin, k_end, BLOCK_K):
        for kk in tl.static_range(BLOCK_K):
            k = k0 + kk
            b_row = tl.load(b_ptr + k.to(tl.int64) * stride_bk + cols[None, :], mask=col_ok[None, :] & (k < k_end),
                            other=0.0, eviction_policy="evict_first").to(tl.float32)
            # a[:, k]: M_PAD scalar loads (one address for every thread: an L1 broadcast)
            a_col = tl.zeros((M_PAD, 1), dtype=tl.float32)
            for m in tl.static_range(M_PAD):
                a_m = tl.load(a_ptr + m * stride_am + k, mask=(m < M) & (k < k_end), other=0.0)
                a_col = tl.where(rows[:, None] == m, a_m.to(tl.float32), a_col)
            acc += a_col * b_row
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if splits == 1:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + z * SLICE_SIZE + offs, acc, mask=mask)
        tl.debug_barrier()  # every thread's partials are stored before the ticket below releases them
        ticket = tl.atomic_add(ticket_ptr + strip, 1, sem="acq_rel", scope="gpu")
        if ticket == splits - 1:  # the last slice of this strip to finish adds all of them, in order
            total = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
            for s0 in range(0, splits, 8):  # eight slices' loads in flight, added in order
                for u in tl.static_range(8):
                    total += tl.load(part_ptr + (s0 + u) * SLICE_SIZE + offs, mask=mask & (s0 + u < splits),
                                     other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


def block_n(element_size: int) -> int:
    """Columns per program: each thread 16 bytes of a row."""
    return 32 * NUM_WARPS * 16 // element_size


def split_count(strips: int, M: int, K: int, element_size: int, sms: int) -> int:
    """K-slices: ~PROGRAMS_PER_SM programs per SM, >= MIN_SLICE rows each, partials under 1/8 of B."""
    if INTERPRET:
        return max(1, min(INTERPRET_SPLIT, K))
    split = min(cdiv(PROGRAMS_PER_SM * sms, strips), K // MIN_SLICE, K * element_size // (64 * M), MAX_SPLIT)
    return max(1, split)


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    m_pad = next_power_of_2(M)
    bn = block_n(a.element_size())
    strips = cdiv(N, bn)
    slice_rows = max(1, cdiv(K, split_count(strips, M, K, a.element_size(), sm_count(a.device))))
    split = max(1, cdiv(K, slice_rows))  # no empty slice; K = 0: one, which stores zeros
    part = torch.empty((split, M, N) if split > 1 else (1,), dtype=torch.float32, device=a.device)
    tickets = torch.zeros(strips if split > 1 else 1, dtype=torch.int32, device=a.device)
    wrap_triton(gemv_kernel)[(strips, split)](a, b, out, part, tickets, M, N, K, a.stride(0), b.stride(0), slice_rows, M * N,
                                              M_PAD=m_pad, BLOCK_N=bn, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS)
