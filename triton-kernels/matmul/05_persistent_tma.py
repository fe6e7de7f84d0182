"""
Step 5 — persistent programs fed by TMA (Hopper, 16-bit)
Changed:  three device-side tensor descriptors (tl.make_tensor_descriptor) replace the pointer
          tiles: A and B tiles arrive by TMA (cp.async.bulk.tensor) straight into swizzled shared
          memory, and the output tile leaves by a TMA store. The grid is one program per SM; each
          walks the tiles tile_id = pid, pid + #SMs, ... in step 3's grouped order, and the loop
          over tiles is flattened with the K loop so the pipeline runs on across tile boundaries.
          Out-of-bounds parts of a tile are zero-filled by TMA on load and clipped on store: no
          masks. Autotuned over a short list (tile, stages, warps, split epilogue).
          Transposed inputs cost no copy: a column-major A (a.t() of a row-major K x M) is
          described as what it is in memory, a row-major K x M, loaded as BLOCK_K x BLOCK_M
          boxes and handed to tl.dot as `.T`; wgmma reads either major-ness of 16-bit operands
          from shared memory, so no shuffle is compiled (likewise B). Two constexpr flags pick
          the variant, one compilation per layout pair, as CUDA step 13's template majors.
Why:      a 128 x 256 x 64 K-step is 2·128·256·64 = 4.2 MFLOP: ~0.56 us of wgmma at the ~990
          TFLOP/s dense bf16 peak shared by 132 SMs, during which 48 KB must land in shared
          memory. Step 4 moves those 48 KB as 3072 cp.async of 16 bytes (12 per thread on 8 warps,
          each with its own address and mask arithmetic) issued by the same warps that issue
          wgmma; TMA moves each tile with one instruction from one thread and computes the
          addresses and the edge fill in hardware. Persistence pays the pipeline fill once per
          SM instead of once per tile (at K = 1536 a tile is only 24 K-steps, of which ~3 are fill)
          and, flattened, overlaps a tile's epilogue with the next tile's first loads.
Still:    one instruction stream issues TMA, waits on barriers, runs wgmma and the epilogue: the
          epilogue of tile i (convert + store 64 KB) is not overlapped with the mainloop of tile
          i + 1. Step 6 gives the loads their own warps (warp specialization). Rows whose pitch
          is not a multiple of 128 bytes run at about half the rate (bf16 3000^3: 0.56x cuBLAS,
          4096^3: 0.97x): most 128-byte box rows straddle two L2 lines. Measured in development
          (bf16, do_bench): every config of the list takes 143-224 us at 3000^3 against
          192-349 us at 4096^3, 1.7x the time a flop; tensor maps built on the host (the driver
          sets 128-byte L2 promotion, where the device-built ones here leave it unset) were
          within 1-3% of these at both shapes, so promotion is not the gap. It is B's pitch far
          more than A's (results/<gpu>/ablation_matmul_triton_pitch.txt, in turns): at 4096 x
          4096 x 3000 (M x K x N) 185.6 us, 140.4 with B's rows padded to whole lines, and the
          same B stored column-major (pitch K = 4096) 139.9; A's rows off the lines (K = 3000)
          cost 1.5%, B column-major with pitch K = 3000 costs 43%; at 3000^3 padding A alone
          takes 148.8 to 132.2, B alone to 108.0. A taller tile (256 x 128: B read over 256
          rows, half its bytes a flop) does not recover it (174.7-181.7 at 4096 x 4096 x 3000).
          CUDA step 13 closes it with 192 x 192 tiles and TMA multicast across a cluster (half
          the L2 traffic a flop); Triton has neither a 192-wide tl.dot tile nor multicast.
Limits:   TMA needs a 16-byte aligned base, one unit stride and a leading stride that is a
          multiple of 16 bytes for a and b (row- or column-major) and out (row-major): 16-bit K
          and N multiples of 8. Otherwise (a[:, 1:], odd K or N) launch raises ValueError; step
          4 takes any strides, and step=None sends such inputs there. With a gradient to take,
          dA (M x K, stored by TMA) needs K too. K = 0 writes zeros without a launch (TMA
          cannot describe an empty K extent).
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      tma_unaligned <= 0; tma_out_unaligned <= 0
Mirrors:  CUDA steps 11 (wgmma + TMA) and 13 (persistent tile scheduler), without clusters
"""
import triton
import triton.language as tl
from rosetta.ops.matmul import is_column_major
from rosetta.triton_kernels.common import cdiv, sm_count, tuned
from rosetta.triton_kernels.tma import (check_tma, load_operands, operand_descriptors,
                                         set_descriptor_allocator, tile_coords)
from torch.library import wrap_triton


def config(bm, bn, bk, warps, stages, subtile):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                          "EPILOGUE_SUBTILE": subtile}, num_warps=warps, num_stages=stages)


CONFIGS = tuned([config(*c) for c in [
    (128, 256, 64, 8, 3, False),
    (128, 256, 64, 8, 4, True),  # half-width epilogue frees shared memory for a 4th stage
    (128, 128, 64, 8, 4, False),
    (128, 128, 64, 4, 4, False),
    (128, 64, 64, 4, 4, False),
    (64, 128, 64, 4, 4, False),
]], config(64, 64, 32, 4, 1, True))


@triton.autotune(configs=CONFIGS, key=["M", "N", "K", "A_COLS", "B_COLS"])
@triton.jit
def matmul_persistent_tma_kernel(
    a_ptr,  # A, M x K, row- or column-major, leading stride 16-byte aligned
    b_ptr,  # B, K x N, row- or column-major, leading stride 16-byte aligned
    out_ptr,  # out, M x N, contiguous
    M, N, K,
    lda, ldb, stride_om,  # leading strides in elements (the other stride is 1)
    A_COLS: tl.constexpr,  # A is column-major: memory holds A^T, K x M row-major
    B_COLS: tl.constexpr,  # B is column-major: memory holds B^T, N x K row-major
    NUM_SMS: tl.constexpr,  # grid size: one program per SM
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,  # store the tile as two BLOCK_M x BLOCK_N/2 halves
):
    dtype = out_ptr.dtype.element_ty
    # A and B described as they lie in memory (a transposed operand is loaded transposed)
    a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, lda, ldb, A_COLS, B_COLS,
                                         BLOCK_M, BLOCK_N, BLOCK_K)
    OUT_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
    c_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_om, 1],
                                       block_shape=[BLOCK_M, OUT_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    # flatten=True: the compiler fuses the tile loop with the K loop so the TMA pipeline keeps
    # prefetching the next tile's first K-slices while this tile's epilogue runs
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a, b = load_operands(a_desc, b_desc, ki, off_m, off_n, A_COLS, B_COLS, BLOCK_K)
            acc = tl.dot(a, b, acc)
        if EPILOGUE_SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([off_m, off_n], left.to(dtype))  # out-of-bounds parts are clipped
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(dtype))


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    if K == 0:
        out.zero_()  # an empty sum; a descriptor with a zero extent is not valid TMA state
        return
    check_tma(5, a, b, out, columns=True)
    set_descriptor_allocator(a.device)
    num_sms = sm_count(a.device)
    a_cols, b_cols = is_column_major(a), is_column_major(b)
    grid = lambda meta: (min(num_sms, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)  # noqa: E731
    wrap_triton(matmul_persistent_tma_kernel)[grid](
        a, b, out, M, N, K, a.stride(1 if a_cols else 0), b.stride(1 if b_cols else 0), out.stride(0),
        A_COLS=a_cols, B_COLS=b_cols, NUM_SMS=num_sms)
