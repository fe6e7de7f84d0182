"""What the Triton split-K matmul steps share (step 7: a second kernel adds the slices; step 9: the
last slice of a tile adds them in the kernel): the tiles the tuner may pick, the rule that splits
K for a tile, and the product of one slice of K."""
import functools

import torch
import triton
import triton.language as tl

from rosetta.triton_kernels.common import INTERPRET, cdiv, next_power_of_2, tuned
from rosetta.triton_kernels.tma import tile_coords

MIN_SLICE_STEPS = 4  # a slice keeps >= 4 BLOCK_K-steps, so the 3-5 stage pipeline is not all fill
MAX_SPLIT = 64  # partials an output adds up at most
REDUCE_LAUNCH_STEPS = 2  # the reduction's launch and kernel boundary (~2-3 us), in K-steps of ~1 us
INTERPRET_SPLIT = 4  # slices under the interpreter: enough to exercise the reduction's order


def config(bm, bn, bk, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                         num_warps=warps, num_stages=stages)


# BLOCK_K 16 so the CPU's small shapes have several K-steps to split
INTERPRET_CONFIG = config(16, 32, 16, 4, 1)
# 16-bit: memory-bound below M ~ 300 at these N, K; long BLOCK_K (128) and 3-4 stages keep
# 60-150 KB of loads in flight per program (sm_90 compile: (BM + BN)·BK·2 bytes a buffer, 3-4
# buffers; the largest, 64 x 128 x 128 and 128 x 256 x 64 at 3 stages, 147 KB of the 227 KB).
HALF_CONFIGS = tuned([config(*c) for c in [
    (16, 64, 128, 4, 4),
    (16, 128, 128, 4, 4),
    (16, 128, 64, 4, 5),
    (16, 256, 64, 4, 4),
    (32, 64, 128, 4, 4),
    (32, 128, 128, 4, 4),
    (32, 128, 64, 4, 4),
    (32, 256, 64, 8, 3),
    (64, 64, 128, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 128, 128, 4, 3),
    (64, 256, 64, 8, 3),
    (128, 64, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
]], INTERPRET_CONFIG)
# fp32 ieee = FFMA from shared memory: register-bound as in step 4 (<= 64 accumulators a thread)
FP32_CONFIGS = tuned([config(*c) for c in [
    (16, 64, 32, 4, 4),
    (16, 128, 32, 4, 4),
    (32, 64, 32, 4, 4),
    (32, 128, 32, 4, 4),
    (64, 64, 32, 4, 4),
    (64, 64, 32, 8, 3),
    (64, 128, 32, 8, 3),
    (128, 64, 32, 8, 3),
    (128, 128, 32, 8, 3),
]], INTERPRET_CONFIG)
KEY = ["M_KEY", "N_KEY", "K_KEY", "B_COLS"]  # the tuner's key: buckets of M, N, K and B's major-ness


def m_bucket(m):
    """M's tuning bucket and the tile height for it: 16 (tl.dot's least), 32, 64, 128, then powers of two."""
    return max(16, next_power_of_2(m))


def tiles_fitting_m(configs, named_args, **kwargs):
    """The tuner's pruning: BLOCK_M = M's bucket for M <= 128 (a taller tile only multiplies
    padding), BLOCK_M 64 or 128 above. Never empty: a list forced by a test is kept."""
    m = m_bucket(named_args["M"])
    fit = [c for c in configs if (c.kwargs["BLOCK_M"] == m if m <= 128 else c.kwargs["BLOCK_M"] >= 64)]
    return fit or configs


def candidate_configs(kernel, M):
    """The configs the tuner may launch for M: the pruned list, or a lone config unpruned, as the
    tuner does (read at the call: a test may have narrowed the list)."""
    return kernel.configs if len(kernel.configs) == 1 else tiles_fitting_m(kernel.configs, {"M": M})


def partials(kernel, a, N, slices):
    """The fp32 workspace for the slices' partial products, (most, M, N): the tuner's pick is known
    only inside the launch, so it is sized for the most slices any config it may pick could take
    ((1, 1, 1) where none splits)."""
    M = a.shape[0]
    most = max(slices(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"])
               for c in candidate_configs(kernel, M))
    return torch.empty((most, M, N) if most > 1 else (1, 1, 1), dtype=torch.float32, device=a.device)


@functools.lru_cache(maxsize=4096)  # the launch asks for every config on every call: keep it cheap
def split_count(M, N, K, block_m, block_n, block_k, itemsize, sms):
    """SPLIT_K for one tile shape: the S (1..MAX_SPLIT, each slice >= 4 K-steps) that gives the shortest
    time, counted in K-steps of the busiest SM, one program per SM at a time:
      cdiv(tiles·S, sms) waves x cdiv(k_steps, S) steps,
      + for S > 1, per wave, the fp32 partial tile's store (BM·BN·4 bytes, in units of one
        K-step's (BM + BN)·BK·itemsize bytes of loads),
      + the reduction's read of S·M·N·4 bytes shared by all SMs, and its launch.
    Ties go to the smaller S. Many tiles (>= ~1 wave) give S = 1."""
    k_steps = cdiv(K, block_k)
    if INTERPRET:  # one "SM": nothing to fill; split anyway so the CPU tests run the reduction
        return max(1, min(k_steps, INTERPRET_SPLIT))
    tiles = cdiv(M, block_m) * cdiv(N, block_n)
    step_bytes = (block_m + block_n) * block_k * itemsize
    best, best_cost = 1, None
    for s in range(1, max(1, min(MAX_SPLIT, k_steps // MIN_SLICE_STEPS)) + 1):
        waves = cdiv(tiles * s, sms)
        cost = waves * cdiv(k_steps, s)
        if s > 1:
            cost += waves * block_m * block_n * 4 / step_bytes + s * M * N * 4 / (sms * step_bytes) \
                + REDUCE_LAUNCH_STEPS
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def slice_rule(M, N, K, itemsize, sms, split_k=None):
    """(block_m, block_n, block_k) -> the slices of a launch with that tile: `split_k` where given
    (at most one a K-step: an ablation, or a way to force the adds), else split_count."""
    # cached per shape; torch.compile's dynamic shapes (SymInts) do not hash: those compute it
    rule = split_count if isinstance(M * N * K, int) else split_count.__wrapped__

    def slices(block_m, block_n, block_k):
        if split_k is not None:
            return max(1, min(split_k, cdiv(K, block_k)))
        return rule(M, N, K, block_m, block_n, block_k, itemsize, sms)
    return slices


@triton.jit
def slice_product(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Program (tile, s) of a (tiles, slices) grid: tile's product over slice s of the K-steps, an
    even share (slices <= k_steps, so none is empty), with step 3's masked pointer loads and
    tl.dot. Returns (acc, rows, cols): the fp32 tile and its int64 row and column indices."""
    tile = tl.program_id(0)
    s = tl.program_id(1)
    slices = tl.num_programs(1)  # SPLIT_K is the grid's second dimension, chosen per tile shape
    pid_m, pid_n = tile_coords(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: rows x stride > 2^31
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    # int64: s x k_steps and k x stride can pass 2^31 for long K or a transposed operand
    k_steps = tl.cdiv(K, BLOCK_K)
    k_lo = s.to(tl.int64) * k_steps // slices
    k_hi = (s + 1).to(tl.int64) * k_steps // slices
    ks = k_lo * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    a_step = tl.full([], BLOCK_K, tl.int64) * stride_ak  # int64 pointer steps (stride_ak may be M)
    b_step = tl.full([], BLOCK_K, tl.int64) * stride_bk
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K == 0: one slice, zero iterations, and the zero accumulator is stored to out
    for k in range(k_lo, k_hi):
        k_ok = tl.arange(0, BLOCK_K) < K - k * BLOCK_K  # only the last K-step is partial
        # other=0.0 on both operands: a padded k adds 0 x 0, a padded row/col is never stored
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        # "ieee": fp32 operands stay fp32 (FFMA, no TF32); 16-bit operands still use the tensor cores
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += a_step
        b_ptrs += b_step
    return acc, rows, cols

