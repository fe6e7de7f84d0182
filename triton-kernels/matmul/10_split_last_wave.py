"""
Step 10 — whole tiles for the full waves, the last partial wave split along K
Changed:  step 5's TMA loads, tiles and tuner, in a grid that is not persistent: with T output
          tiles on S SMs, the first T - T mod S tiles (the full waves, in step 3's grouped order)
          are one program each, over all of K, stored as step 5 stores; the T mod S tiles left
          over are each cut into P slices of K (P = S // (T mod S), each slice at least 4
          K-steps, at most 16 slices), one program a slice, so the last wave holds ~S programs
          where it held T mod S. A slice stores its fp32 tile in its own slot of a workspace and
          takes a ticket on its tile's counter (acq_rel, after a barrier, as step 9); the slice
          that draws the last ticket adds the P slots in the order 0, 1, ..., P - 1 (the same
          bits whichever comes last), stores the tile by TMA and resets the counter. Under one
          wave (T < S) every tile is split: step 9's idea on TMA loads.
Why:      step 5 at bf16 256 x 3584 x 18944 (Qwen2-7B's MLP, 256 tokens) has 148 tiles of
          128 x 256 for 132 SMs: a second wave of 16 tiles, the whole K each, while 116 SMs
          idle; it takes 79.7 us where cuBLAS takes 55 (0.69x, suite). Each wave is ~40 us of
          tile time here; split 8 ways, the 16 tiles' K takes ~1/8 of a wave, plus the slots'
          round trip through L2 (16 x 8 x 128 KB written once, read once) and the fix-up's
          adds: predicted ~47-52 us, 1.05-1.15x cuBLAS, where the bytes of B (136 MB, ~45 us at
          3 TB/s) set the floor. 128 x 4096 x 4096 (16 tiles: all split 8 ways): ~step 9's
          time with TMA loads (step 9's pointer loads: 0.77x).
Still:    measured (H100, bf16 suite, results/<gpu>/ablation_matmul_triton_10_suite.txt): 256 x
          3584 x 18944 80.4 us against step 5's 81.0, not ~50: the ragged wave was not what held
          it. Each 128 x 256 tile streams 2.75 MB of A and B from L2 over its K: the first
          wave's 132 tiles move ~363 MB, ~56 us at the 6.5 TB/s `make survey` measured for L2
          reads, and the 16 split tiles 44 MB more (~7 us): L2 traffic, not the ragged wave,
          sets ~63 of the 80 us, and splitting K moves the same bytes. cuBLAS's 55 us must
          read fewer bytes a flop (a larger tile, or multicast, which Triton lacks). At small M the non-persistent grid pays a device-side tensor map and a
          pipeline fill per program, and the split its slots: 1 x 768 x 3072 14.7 us against
          step 9's 8.4. The split is decided from the tile count alone: a tail of many tiles (T mod S near
          S) gets P = 1 and keeps step 5's ragged wave, and where the full waves are few the
          split wave still pays its fix-up. The fix-up is one program per tile, after its own
          slice, as in step 9. A CUDA graph holds the counters of the stream it was captured on,
          as step 9's.
Limits:   step 5's: TMA operands (16-byte aligned base, leading stride a multiple of 16
          bytes: 16-bit K and N multiples of 8), raised before launch otherwise; step 4 takes
          any strides. Workspace: the split tiles' fp32 slots (P x BLOCK_M x BLOCK_N each, for
          the largest any config may take) and one int32 counter a split tile.
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      tma_unaligned <= 0; tma_out_unaligned <= 0
Mirrors:  CUDA step 17 (stream-K: whole waves data-parallel, the last shared, shared tiles added
          in the kernel behind a counter), with the tail shared by K-slices instead of a line of
          iterations
Slower:   than the best earlier step on 51 of the 54 bf16 suite cases measured on the H100, the
          other three within 1% (a lesson, not a default)
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.ops.matmul import is_column_major
from rosetta.triton_kernels.common import INTERPRET, cdiv, sm_count, tuned
from rosetta.triton_kernels.tma import (check_tma, load_operands, operand_descriptors,
                                         set_descriptor_allocator, tile_coords)
from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream

MIN_SLICE_STEPS = 4  # K-steps a slice keeps at least: the 3-4 stage pipeline is not all fill
MAX_SLICES = 16
# the same two inside kernels, which read only constexpr globals
_MIN_SLICE_STEPS = tl.constexpr(MIN_SLICE_STEPS)
_MAX_SLICES = tl.constexpr(MAX_SLICES)
INTERPRET_SMS = 3  # the "SMs" under the interpreter: small CPU problems still leave a tail to split


def config(bm, bn, bk, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps,
                         num_stages=stages)


CONFIGS = tuned([config(*c) for c in [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
]], config(32, 32, 16, 4, 1))


def split_plan(tiles: int, k_steps: int, sms: int) -> tuple[int, int]:
    """(whole, slices): the tiles run whole (the full waves) and the slices of K each tile left over
    is cut into. The kernel computes the same from its arguments (split_plan_device)."""
    tail = tiles % sms
    if tail == 0:
        return tiles, 1
    return tiles - tail, max(1, min(sms // tail, k_steps // MIN_SLICE_STEPS, MAX_SLICES))


@triton.jit
def split_plan_device(tiles, k_steps, NUM_SMS: tl.constexpr):
    tail = tiles % NUM_SMS
    slices = tl.minimum(tl.minimum(NUM_SMS // tl.maximum(tail, 1), k_steps // _MIN_SLICE_STEPS), _MAX_SLICES)
    slices = tl.where(tail == 0, 1, tl.maximum(slices, 1))
    return tiles - tail, slices


@triton.autotune(configs=CONFIGS, key=["M", "N", "K", "A_COLS", "B_COLS"])
@triton.jit
def matmul_split_last_wave_kernel(
    a_ptr,  # A, M x K, row- or column-major, leading stride 16-byte aligned
    b_ptr,  # B, K x N, row- or column-major, leading stride 16-byte aligned
    out_ptr,  # out, M x N, contiguous
    part_ptr,  # float32 slots, BLOCK_M x BLOCK_N each: slot (t - whole) * slices + s
    ticket_ptr,  # int32 per split tile: its slices done so far; zero at the start, left zero
    M, N, K,
    lda, ldb, stride_om,  # leading strides in elements (the other stride is 1)
    A_COLS: tl.constexpr,  # A is column-major: memory holds A^T, K x M row-major
    B_COLS: tl.constexpr,  # B is column-major: memory holds B^T, N x K row-major
    NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    dtype = out_ptr.dtype.element_ty
    a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, lda, ldb, A_COLS, B_COLS,
                                         BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_om, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    whole, slices = split_plan_device(num_pid_m * num_pid_n, k_steps, NUM_SMS)
    pid = tl.program_id(0)
    split = pid >= whole
    q = tl.maximum(pid - whole, 0)  # a split program's index past the whole tiles
    tile = tl.where(split, whole + q // slices, pid)
    s = tl.where(split, q % slices, 0)
    shares = tl.where(split, slices, 1)
    k_lo = s * k_steps // shares
    k_hi = (s + 1) * k_steps // shares
    pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        a, b = load_operands(a_desc, b_desc, ki, off_m, off_n, A_COLS, B_COLS, BLOCK_K)
        acc = tl.dot(a, b, acc)
    if shares == 1:  # a whole tile (or a tail too short in K to split): stored as step 5 stores
        c_desc.store([off_m, off_n], acc.to(dtype))  # out-of-bounds parts are clipped
    else:
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        first = part_ptr + (tile - whole).to(tl.int64) * slices * BLOCK_M * BLOCK_N + local
        tl.store(first + s.to(tl.int64) * BLOCK_M * BLOCK_N, acc)
        tl.debug_barrier()  # every thread's slot is stored before the ticket below releases it
        ticket = tl.atomic_add(ticket_ptr + (tile - whole), 1, sem="acq_rel", scope="gpu")
        if ticket == slices - 1:  # the last slice of this tile: every other slot is in L2
            # Added in slice order, one slot at a time, from L2 (.cg: written by other programs
            # during this launch, never in this SM's L1)
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in range(0, slices):
                total += tl.load(first + j * BLOCK_M * BLOCK_N, cache_modifier=".cg")
            c_desc.store([off_m, off_n], total.to(dtype))
            tl.store(ticket_ptr + (tile - whole), 0)  # every slice has drawn: zero for the next launch


def _sms(device) -> int:
    return INTERPRET_SMS if INTERPRET else sm_count(device)


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    if K == 0:
        out.zero_()  # an empty sum; a descriptor with a zero extent is not valid TMA state
        return
    check_tma(10, a, b, out, columns=True)
    set_descriptor_allocator(a.device)
    sms = _sms(a.device)
    # the workspace and counters for the config that needs the most (the tuner picks inside the launch)
    plans = []
    for c in matmul_split_last_wave_kernel.configs:
        bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        tiles = cdiv(M, bm) * cdiv(N, bn)
        whole, slices = split_plan(tiles, cdiv(K, bk), sms)
        split_tiles = tiles - whole if slices > 1 else 0
        plans.append((split_tiles * slices * bm * bn, split_tiles))
    part = torch.empty(max(1, max(p[0] for p in plans)), dtype=torch.float32, device=a.device)
    counters = tickets(a, max(p[1] for p in plans))

    def grid(meta):
        tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
        whole, slices = split_plan(tiles, cdiv(K, meta["BLOCK_K"]), sms)
        return (whole + (tiles - whole) * slices,)

    a_cols, b_cols = is_column_major(a), is_column_major(b)
    wrap_triton(matmul_split_last_wave_kernel)[grid](
        a, b, out, part, counters, M, N, K, a.stride(1 if a_cols else 0), b.stride(1 if b_cols else 0),
        out.stride(0), A_COLS=a_cols, B_COLS=b_cols, NUM_SMS=sms)
