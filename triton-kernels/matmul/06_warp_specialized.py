"""
Step 6 — warp specialization: producer warps for TMA, two consumer warpgroups for wgmma
Changed:  the persistent tile loop of step 5 becomes tl.range(..., warp_specialize=True,
          flatten=False): the compiler splits the loop body into partitions that run on
          different warps and hand shared-memory buffers to each other through mbarriers. On
          sm_90 at num_warps = 4 it builds 12 warps: a 4-warp producer partition that only
          issues the TMA loads into a ring of num_stages buffers (it gives registers back with
          setmaxnreg.dec) and two 4-warp consumer warpgroups (setmaxnreg.inc to 232) that each own
          half of the tile's rows (64 x BLOCK_N accumulator), wait on "full" barriers, run wgmma,
          release the buffer and store their half of the tile by TMA.
          Triton 3.6 on sm_90 applies this only to an unflattened loop with num_warps = 4; with
          flatten=True or 8 warps it compiles step 5's single-stream code without a word, so
          every config here uses 4 warps and a whole-tile epilogue. Proof that it took effect:
          the TTGIR has a ttg.warp_specialize op with partition0/partition1, the PTX has
          setmaxnreg.dec/.inc and the SASS USETMAXREG; step 5's has none of them.
Why:      in step 5 the warps that run wgmma also issue every load and wait on it, and the
          epilogue (fp32 -> bf16 and a 64 KB TMA store per 128 x 256 tile) stalls the load
          stream too. With a producer the loads for the next K-slices (and the next tile) are
          issued while the consumers multiply or store, and the consumers' loop is only
          wait / wgmma / release. Register reallocation lets two consumer warpgroups hold a
          128 x 256 fp32 accumulator (128 registers each per thread) without spilling.
Still:    both consumer warpgroups work on the same tile and reach the epilogue together, so the
          tensor cores idle during each store: cuBLAS and CUDA step 12 ping-pong two tiles
          between consumer groups, and CUDA step 13 shares loads across a cluster with TMA
          multicast; Triton's tl-level language exposes neither (Gluon does).
          num_stages = 5 gave wrong results (unwritten and garbage tiles) on the H100 with
          Triton 3.6 at 128 x 128 and 128 x 64 tiles: the list stays at 3-4 stages, each config
          checked against cuBLAS on 4096^3, 8192^3, 5120 x 1536 x 3072 and an edge shape.
          Worse, with every config: a launch long enough to be preempted (46,344 x 16 x 46,344,
          ~3 ms) while another process runs on the GPU leaves ~90,000 output elements unwritten
          each time, the first of them always on a row that is a multiple of 64 (as a consumer
          warpgroup's half of a tile would be); alone it is right, and steps 5 and CUDA 11-13
          are right in the same test. In the PTX each consumer warpgroup rebuilds the output's
          tensor map in global scratch before each TMA store of its 64 rows; the same kernel
          without warp_specialize is right under the same load. Hence the Hazard line.
          Transposed inputs as in step 5 (descriptors of what lies in memory, `.T` into tl.dot).
Limits:   as step 5: 16-byte aligned bases and leading strides (16-bit: multiples of 8 elements),
          for out too (and dA's K when a gradient is taken), else ValueError naming step 4, where
          step=None sends such inputs. K = 0 writes zeros without a launch.
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      tma_unaligned <= 0; tma_out_unaligned <= 0
Mirrors:  CUDA step 12 (warp-specialized producer/consumer), persistent as step 13
Hazard:   Triton 3.6's warp-specialized code leaves output tiles unwritten when the kernel is
          preempted by another process's work: run it by number only (step=None stops at 5)
"""
import triton
import triton.language as tl
from rosetta.ops.matmul import is_column_major
from rosetta.triton_kernels.common import cdiv, sm_count, tuned
from rosetta.triton_kernels.tma import (check_tma, load_operands, operand_descriptors,
                                         set_descriptor_allocator, tile_coords)
from torch.library import wrap_triton


def config(bm, bn, bk, stages):
    # num_warps = 4: Triton 3.6 warp-specializes on sm_90 only at 4 warps (it then adds two
    # 4-warp consumer partitions of its own: 12 warps in all)
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                         num_warps=4, num_stages=stages)


CONFIGS = tuned([config(*c) for c in [
    (128, 256, 64, 3),
    (128, 256, 32, 4),
    (128, 128, 64, 4),
    (128, 128, 64, 3),
    (128, 64, 64, 4),
]], config(64, 64, 32, 1))


@triton.autotune(configs=CONFIGS, key=["M", "N", "K", "A_COLS", "B_COLS"])
@triton.jit
def matmul_warp_specialized_kernel(
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
):
    dtype = out_ptr.dtype.element_ty
    # A and B described as they lie in memory (a transposed operand is loaded transposed)
    a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, lda, ldb, A_COLS, B_COLS,
                                         BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_om, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    # warp_specialize=True splits this loop into a TMA-producer partition and the wgmma/epilogue
    # partition; flatten must stay False on sm_90 or the split is silently dropped
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=False, warp_specialize=True):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a, b = load_operands(a_desc, b_desc, ki, off_m, off_n, A_COLS, B_COLS, BLOCK_K)
            acc = tl.dot(a, b, acc)
        c_desc.store([off_m, off_n], acc.to(dtype))  # out-of-bounds parts are clipped


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    if K == 0:
        out.zero_()  # an empty sum; a descriptor with a zero extent is not valid TMA state
        return
    check_tma(6, a, b, out, columns=True)
    set_descriptor_allocator(a.device)
    num_sms = sm_count(a.device)
    a_cols, b_cols = is_column_major(a), is_column_major(b)
    grid = lambda meta: (min(num_sms, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)  # noqa: E731
    wrap_triton(matmul_warp_specialized_kernel)[grid](
        a, b, out, M, N, K, a.stride(1 if a_cols else 0), b.stride(1 if b_cols else 0), out.stride(0),
        A_COLS=a_cols, B_COLS=b_cols, NUM_SMS=num_sms)
