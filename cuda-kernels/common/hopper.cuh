// Hopper (sm_90a) pieces of the tensor-core matmul steps 11-13 and of softmax step 8, each taught
// by the first step that uses it:
//   tc_matmul_launch                     16-bit launcher prologue (M or N == 0, K == 0)      step 11
//   TmaOperand / make_tma_operand        tensor maps for A and B, either major-ness            step 11
//   mbarrier_*, tma_load                 the copy engine completing on a shared-memory barrier  step 11
//   OperandTile                          a k-tile in 128-byte-swizzled shared memory + its
//                                        wgmma descriptors                                    step 11
//   wgmma_*                              warpgroup MMA m64nNk16, fp32 accumulators             step 11
//   store_accumulators                   masked register -> global epilogue                    step 11
//   set_max_registers                    setmaxnreg for producer / consumer warpgroups         step 12
//   tma_load_multicast, cluster_*,
//   tma_store, grouped_tile              clusters, persistent tiles, TMA epilogue             step 13
//   bulk_load                            a 1-D bulk copy, no tensor map           (softmax) step 8
// Everything here needs -gencode=arch=compute_90a,code=sm_90a (wgmma and setmaxnreg are sm_90a).
#pragma once

#include <cuda.h>          // CUtensorMap and its enums: types only, libcuda is not linked
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled: the driver function is looked up at run time

#include "matmul.cuh"

namespace rosetta::sm90 {

// ------------------------------------------------------------------------------------------------
// Host side

// Shape checks shared by steps 11-13 for bf16/fp16 inputs: nothing to launch for M or N == 0,
// zeros for K == 0 (no tensor map needed), else launch(T{}, M, N, K) -> cudaError_t (a launcher
// returns cudaErrorInvalidValue for inputs its tensor maps cannot describe).
template <typename Launch>
cudaError_t tc_matmul_launch(const MatmulArgs& p, cudaStream_t stream, Launch&& launch) {
  const int64_t M = p.a.size[0], K = p.a.size[1], N = p.b.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = dispatch_dtype(p.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (K == 0) {  // the empty sum: zeros (all-zero bits are +0 in bf16 and fp16)
      cudaMemsetAsync(p.out.data, 0, M * N * int64_t(sizeof(T)), stream);
      return;
    }
    status = launch(tag, int(M), int(N), int(K));
  });
  return status != cudaSuccess ? status : launched;
}

// cuTensorMapEncodeTiled from the driver the runtime already loaded (no -lcuda at link time).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
#else
    cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &found);
#endif
    return found == cudaDriverEntryPointSuccess ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f) : nullptr;
  }();
  return fn;
}

template <typename T>
constexpr CUtensorMapDataType tma_dtype = std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;

// A 2-D tensor map over `inner` x `outer` elements (inner contiguous, rows `row_stride` elements
// apart) with boxes of box_inner x box_outer and the given swizzle. Out-of-bounds box elements
// read as zero (FLOAT_OOB_FILL_NONE) and are dropped on stores: the tails need no code.
// L2 promotion (the size of the L2 requests a box row turns into) is 128 bytes, one box row.
// 256 costs nothing on rows whose pitch is a multiple of 128 bytes, but where most rows straddle
// two L2 lines (K = 3000: 6000-byte rows) it slowed step 13's loads by a fifth. Measured in
// development (bf16 3000^3, loads alone): 97-98 us with 256-byte promotion, 81-84 with 128, 64
// or none; 4096^3 and 5120 x 1536 x 3072 level, fp16 8192^3 1.8% slower in that process (within
// the run-to-run spread of that shape, KERNEL_LOG step 13's Revision 2).
template <typename T>
bool encode_map(CUtensorMap& map, const void* data, int64_t inner, int64_t outer, int64_t row_stride,
                int box_inner, int box_outer, CUtensorMapSwizzle swizzle) {
  const auto encode = tensor_map_encoder();
  // The copy engine's rules: a 16-byte aligned base and row strides in whole 16-byte units. A
  // single row's stride is never used, so any legal value stands in for it.
  if (outer == 1) row_stride = (inner + 7) / 8 * 8;
  if (!encode || !aligned16(data) || (row_stride * int64_t(sizeof(T))) % 16 != 0) return false;
  // A driver call: it fails in a thread with no current context. torch's autograd worker thread
  // can get here before any runtime call has bound one (torch skips cudaSetDevice when the device
  // index already matches), so bind the current device's primary context first.
  int device = 0;
  cudaGetDevice(&device);
  cudaSetDevice(device);
  const cuuint64_t dims[2] = {cuuint64_t(inner), cuuint64_t(outer)};
  const cuuint64_t strides[1] = {cuuint64_t(row_stride * int64_t(sizeof(T)))};
  const cuuint32_t box[2] = {cuuint32_t(box_inner), cuuint32_t(box_outer)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(&map, tma_dtype<T>, 2, const_cast<void*>(data), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// One operand of out = A @ B as the copy engine sees it. An operand is K-major when its k index
// is the contiguous one (A row-major, B given as b_t.t()), MN-major when m (A) or n (B) is (A
// given as a_t.t(), B row-major). wgmma reads both from shared memory (its transpose bits), so
// the map is built over whichever stride is 1 and no copy is ever made.
struct TmaOperand {
  CUtensorMap map;
  bool mn_major;
};

// x: A (M x K, is_b false) or B (K x N, is_b true). kmajor_box_rows: the MN rows of one K-major
// box (the tile's MN extent, or a part of it); MN-major boxes are always 64 (mn) x 64 (k).
// False when neither major-ness meets the copy engine's alignment rules.
template <typename T>
bool make_tma_operand(TmaOperand& op, const Tensor& x, bool is_b, int kmajor_box_rows) {
  const int mn_dim = is_b ? 1 : 0, k_dim = 1 - mn_dim;
  const int64_t mn = x.size[mn_dim], k = x.size[k_dim];
  // 128-byte swizzle: the box's inner extent is exactly one 128-byte swizzle row (64 elements).
  if (x.stride[k_dim] == 1 || k == 1) {
    op.mn_major = false;
    if (encode_map<T>(op.map, x.data, k, mn, x.stride[mn_dim], 64, kmajor_box_rows, CU_TENSOR_MAP_SWIZZLE_128B)) return true;
  }
  if (x.stride[mn_dim] == 1 || mn == 1) {
    op.mn_major = true;
    if (encode_map<T>(op.map, x.data, mn, k, x.stride[k_dim], 64, 64, CU_TENSOR_MAP_SWIZZLE_128B)) return true;
  }
  return false;
}

// Calls f(bool_constant<mn_major_a>, bool_constant<mn_major_b>): wgmma's transpose flags are
// immediates, so each combination is its own kernel instantiation.
template <typename F> void with_majors(bool mn_a, bool mn_b, F&& f) {
  using Y = std::true_type;
  using N = std::false_type;
  if (mn_a) mn_b ? f(Y{}, Y{}) : f(Y{}, N{});
  else mn_b ? f(N{}, Y{}) : f(N{}, N{});
}

// ------------------------------------------------------------------------------------------------
// Device side: barriers and the copy engine

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A transaction barrier: a phase completes when `count` arrivals have happened and every byte
// announced by expect_tx has landed. Waiters name the phase parity they wait for.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes initialised barriers visible to the copy engine and (with clusters) to the other CTAs.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive once and announce `bytes` more to land in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Arrive on the barrier at the same shared-memory offset in CTA `cta` of the cluster. Default
// (CTA-scope) release: what it publishes, "my wgmma reads of this stage are done", was settled by
// wgmma.wait_group; a cluster-scope release would stall the issuing warp for nothing.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)), "r"(cta)
      : "memory");
}
// Spin until the phase with this parity has completed (a fresh barrier's "previous" phase, parity
// 1, counts as completed: producers start waiting on empty slots with parity 1).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity)
      : "memory");
}

// One box of the tensor map at coordinates (c0 inner, c1 outer) into shared memory; the bytes
// complete a transaction on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar)) : "memory");
}
// The same box written to the same offset of every CTA in `cta_mask`, each completing its own
// barrier at bar's offset.
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                   uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(cta_mask) : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) copied from global into this CTA's
// shared memory by the copy engine, completing a transaction on `bar`: the 1-D bulk form, no
// tensor map.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

// ------------------------------------------------------------------------------------------------
// Device side: operand tiles and wgmma descriptors
//
// A k-tile of one operand is kRows (m or n) x 64 (k) 16-bit elements, written by the copy engine
// with CU_TENSOR_MAP_SWIZZLE_128B. That mode writes each 128-byte box row r at byte r * 128 and
// XORs the 16-byte chunk index (address bits 4-6) with r % 8 (bits 7-9): 8 rows form a 1024-byte
// swizzle atom, so tiles sit on 1024-byte boundaries. It is exactly wgmma's "128B swizzle"
// canonical layout (descriptor mode 1), applied to the same address bits, so the tensor core
// un-swizzles what the copy engine swizzled. Per major-ness:
//
//  K-major (box 64 k x kRows): row r (one m or n) holds its 64 k values, 128 bytes. A wgmma
//    operand of rows r0.. and k slice kk (16 k, 32 bytes) starts at r0 * 128 + kk * 32: the
//    offset inside the swizzle atom is fine because the hardware swizzles the final address.
//    SBO (stride byte offset) = 1024: from one 8-row group to the next. LBO is unused with
//    swizzling (the k extent of one instruction, 32 bytes, stays inside the 128-byte row); 16.
//  MN-major (boxes 64 mn x 64 k, kRows / 64 of them, 8 KB each): box j holds mn 64j .. 64j+63;
//    its row kr (one k) holds those 64 mn values, 128 bytes. Slice kk starts at k row 16 kk:
//    byte (r0 / 64) * 8192 + kk * 2048 (a multiple of 1024: the atom phase is unchanged).
//    LBO = 8192: from one 64-wide mn block to the next (used when the instruction's n > 64);
//    SBO = 1024: from k rows 0-7 to k rows 8-15.
//
// Descriptor bits (PTX "matrix descriptor"): [0,14) start address >> 4, [16,30) LBO >> 4,
// [32,46) SBO >> 4, [49,52) base offset (0: atoms 1024-aligned), [62,64) swizzle (1 = 128B).
__device__ __forceinline__ uint64_t smem_descriptor(const void* p, uint32_t lbo, uint32_t sbo) {
  return uint64_t((smem_u32(p) & 0x3FFFF) >> 4) | uint64_t(lbo >> 4) << 16 | uint64_t(sbo >> 4) << 32 | 1ull << 62;
}

template <int kRows, bool kMnMajor>
struct OperandTile {
  static_assert(kRows % 64 == 0, "whole 64-row blocks (MN-major boxes, 1024-byte atoms)");
  static constexpr int kBytes = kRows * 64 * 2;

  // Copies k columns k0 .. k0 + 63 of the tile whose row 0 is mn0: all of it, or with parts > 1
  // this CTA's share `part` (a cluster multicasting one operand splits it this way). K-major: a
  // band of kRows / parts rows, one box (make_tma_operand's kmajor_box_rows = kRows / parts);
  // MN-major: every parts-th 64-row box.
  __device__ static void load(const CUtensorMap* map, void* tile, uint64_t* bar, int mn0, int k0, int part = 0,
                              int parts = 1, uint16_t multicast = 0) {
    char* t = static_cast<char*>(tile);
    if constexpr (kMnMajor) {
      for (int j = part; j < kRows / 64; j += parts) copy(t + j * 8192, map, bar, mn0 + 64 * j, k0, multicast);
    } else {
      const int first = part * (kRows / parts);
      copy(t + first * 128, map, bar, k0, mn0 + first, multicast);
    }
  }

  // wgmma descriptor of rows r0 .. (the instruction's m or n extent) for k slice kk (0..3).
  __device__ static uint64_t descriptor(const void* tile, int r0, int kk) {
    const char* t = static_cast<const char*>(tile);
    if constexpr (kMnMajor) return smem_descriptor(t + (r0 / 64) * 8192 + kk * 2048, 8192, 1024);
    else return smem_descriptor(t + r0 * 128 + kk * 32, 16, 1024);
  }

 private:
  __device__ static void copy(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, uint16_t multicast) {
    if (multicast) tma_load_multicast(dst, map, bar, c0, c1, multicast);
    else tma_load(dst, map, bar, c0, c1);
  }
};

// ------------------------------------------------------------------------------------------------
// Device side: warpgroup MMA (all 128 threads of a warpgroup execute these together)

// Orders this thread's register and shared-memory accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across a wgmma_wait.
template <int kN>
__device__ __forceinline__ void fence_accumulators(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define ROSETTA_WGMMA_D128 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
  "}"
#define ROSETTA_WGMMA_D128_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define ROSETTA_WGMMA_D192 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
  "}"
#define ROSETTA_WGMMA_D192_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define ROSETTA_WGMMA_D256 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}"
#define ROSETTA_WGMMA_D256_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// d (64 x kN fp32, the warpgroup's accumulator fragment) += A (64 x 16) * B (16 x kN), both read
// from shared memory through descriptors. kTransA / kTransB: the operand is MN-major.
// Accumulator layout: warp w of the warpgroup, lane l: d[4c + 2h + e] is row 16w + l/4 + 8h,
// column 8c + 2(l % 4) + e.
// The operands after the kN / 2 accumulators: a-desc, b-desc, scale-d (1: accumulate), tnsp-a,
// tnsp-b; their %-numbers are passed in as strings (I0 = kN / 2).
#define ROSETTA_WGMMA(N, TY, I0, I1, I2, I3, I4)                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" I2 ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " ROSETTA_WGMMA_D##N \
               ", %" I0 ", %" I1 ", p, 1, 1, %" I3 ", %" I4 ";\n}\n"                            \
               : ROSETTA_WGMMA_D##N##_OPERANDS(d)                                                 \
               : "l"(desc_a), "l"(desc_b), "r"(1), "n"(int(kTransA)), "n"(int(kTransB)))

template <typename T, int kN, bool kTransA, bool kTransB>
__device__ __forceinline__ void wgmma(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(kN == 128 || kN == 192 || kN == 256, "the instantiated wgmma widths");
  constexpr bool kF16 = std::is_same_v<T, __half>;
  if constexpr (kN == 128 && kF16) ROSETTA_WGMMA(128, "f16", "64", "65", "66", "67", "68");
  if constexpr (kN == 128 && !kF16) ROSETTA_WGMMA(128, "bf16", "64", "65", "66", "67", "68");
  if constexpr (kN == 192 && kF16) ROSETTA_WGMMA(192, "f16", "96", "97", "98", "99", "100");
  if constexpr (kN == 192 && !kF16) ROSETTA_WGMMA(192, "bf16", "96", "97", "98", "99", "100");
  if constexpr (kN == 256 && kF16) ROSETTA_WGMMA(256, "f16", "128", "129", "130", "131", "132");
  if constexpr (kN == 256 && !kF16) ROSETTA_WGMMA(256, "bf16", "128", "129", "130", "131", "132");
}
#undef ROSETTA_WGMMA

// Warpgroup register budgets (sm_90a): producers give registers back, consumers take them. Takes
// effect only under a per-thread cap at entry (__launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void set_max_registers() {
  if constexpr (kRegs < 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ------------------------------------------------------------------------------------------------
// Device side: epilogues

// One warpgroup's 64 x kN accumulators (layout above) to out rows m0.., columns n0.. (M x N,
// row stride N), converted to T; masked at the tails; two neighbours per 4-byte store when
// `pairs` (N even and out 4-byte aligned).
template <typename T, int kN>
__device__ __forceinline__ void store_accumulators(const float (&d)[kN / 2], T* out, int M, int N, int m0, int n0,
                                                   bool pairs) {
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m0 + 16 * warp + lane / 4 + 8 * h;
    if (m >= M) continue;
    T* row = out + int64_t(m) * N;  // int64: m * N passes 2^31 for big outputs
#pragma unroll
    for (int c = 0; c < kN / 8; ++c) {
      const int n = n0 + 8 * c + 2 * (lane % 4);
      const T v0 = from_float<T>(d[4 * c + 2 * h]), v1 = from_float<T>(d[4 * c + 2 * h + 1]);
      if (pairs && n + 1 < N) {
        const T v[2] = {v0, v1};
        *reinterpret_cast<uint32_t*>(row + n) = *reinterpret_cast<const uint32_t*>(v);
      } else {
        if (n < N) row[n] = v0;
        if (n + 1 < N) row[n + 1] = v1;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Device side: clusters, persistent tiles, TMA stores (step 13)

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster arrives, then waits: orders barrier initialisation
// before any peer uses it, and keeps a CTA alive until its peers are done with its shared memory.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// A barrier among `threads` threads (whole warps) only: one warpgroup without the others.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Ordinary shared-memory stores become visible to the copy engine (the async proxy) that reads
// them next; each writing thread fences before the barrier that precedes the TMA store.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// A box of shared memory to the tensor map's coordinates (c0 inner, c1 outer); out-of-bounds
// parts of the box are not written.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
               ::"l"(map), "r"(c0), "r"(c1), "r"(smem_u32(src)) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// All but the kPending most recently committed store groups have finished reading shared memory
// (their source may be overwritten).
template <int kPending = 0>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// The committed stores are complete.
__device__ __forceinline__ void tma_store_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Tile index -> (tile row, tile column) in step 7's grouped order (kGroup tile rows walked column
// by column), for a persistent loop's index instead of blockIdx.x.
__device__ __forceinline__ void grouped_tile(int index, int rows, int cols, int group, int& r, int& c) {
  const int per_group = group * cols;
  const int first = index / per_group * group;
  const int height = min(rows - first, group);
  const int in_group = index % per_group;
  r = first + in_group % height;
  c = in_group / height;
}

}  // namespace rosetta::sm90
