// Hopper (sm_90a) pieces of the attention ladder, taught by step 4 (FlashAttention-3; its backward's own
// pieces are in attention_sm90_backward.cuh):
//   encode_heads_map<T>(map, tensor, box_rows)  a 4-D tensor map over a (B, H, S, D) tensor at its
//                                     own strides: boxes of 64 (d) x box_rows (s), 128-byte swizzle;
//                                     rows past S read as zeros, never another head's rows
//   tma_load_4d                       one box at (d, s, h, b) completing on an mbarrier
//   wgmma_ss<T, kN>                   d (64 x kN fp32) = A B or d += A B, A and B from shared memory
//                                     through descriptors, both K-major (S = Q K^T); kN = 128 or 176
//   wgmma_rs<T, kN>                   d += A B, A (64 x 16) from registers, B MN-major in shared
//                                     memory (O += P V: P never leaves registers)
//   named_barrier_arrive              bar.arrive: signal a named barrier without waiting on it
//   exp2_approx                       ex2.approx.ftz (exp2f adds a denormal-range fixup per call)
// The barriers, tensor-map encoder and descriptors are hopper.cuh's (matmul steps 11-13).
#pragma once

#include "hopper.cuh"

namespace rosetta::attention_sm90 {

// A (B, H, S, D) tensor (D contiguous) as a 4-D map (d, s, h, b). The copy engine needs a
// 16-byte aligned base and every stride in whole 16-byte units; a dimension of size 1 is never
// stepped over, so any legal stride stands in for its own. False when the tensor breaks the rules.
template <typename T>
bool encode_heads_map(CUtensorMap& map, const Tensor& t, int box_rows) {
  const auto encode = sm90::tensor_map_encoder();
  const int64_t B = t.size[0], H = t.size[1], S = t.size[2], D = t.size[3], e = sizeof(T);
  if (!encode || !aligned16(t.data) || t.stride[3] != 1) return false;
  const int64_t row = S > 1 ? t.stride[2] : D;
  const int64_t head = H > 1 ? t.stride[1] : row * S;
  const int64_t batch = B > 1 ? t.stride[0] : head * H;
  for (const int64_t s : {row, head, batch})
    if (s <= 0 || (s * e) % 16 != 0 || s * e >= (int64_t(1) << 40)) return false;
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(S), cuuint64_t(H), cuuint64_t(B)};
  const cuuint64_t strides[3] = {cuuint64_t(row * e), cuuint64_t(head * e), cuuint64_t(batch * e)};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(&map, sm90::tma_dtype<T>, 4, t.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The box at (c0 = d, c1 = s, c2 = h, c3 = b) into shared memory; its bytes (all of the box,
// zero-filled parts included) complete a transaction on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(sm90::smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(sm90::smem_u32(bar))
      : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#define ROSETTA_ATTN_ACC32 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
  "}"
#define ROSETTA_ATTN_ACC32_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define ROSETTA_ATTN_ACC64 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
  "}"
#define ROSETTA_ATTN_ACC64_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define ROSETTA_ATTN_ACC88 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87" \
  "}"
#define ROSETTA_ATTN_ACC88_OPERANDS(d) \
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
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])

// Accumulator layout of m64nNk16 (d[kN / 2] per thread; warp w of the warpgroup, lane l, g = l / 4,
// t = l % 4): d[4c + 2h + e] is row 16w + g + 8h, column 8c + 2t + e.
//
// d = (accumulate ? d : 0) + A B: A (64 x 16) and B (16 x kN, stored as kN rows of k) both
// K-major in 128-byte-swizzled shared memory.
template <typename T, int kN>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(kN == 128 || kN == 176, "the instantiated widths (176: FA3's key tile at D = 128)");
  constexpr bool kF16 = std::is_same_v<T, __half>;
  if constexpr (kN == 128 && kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ROSETTA_ATTN_ACC64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : ROSETTA_ATTN_ACC64_OPERANDS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
  if constexpr (kN == 128 && !kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ROSETTA_ATTN_ACC64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : ROSETTA_ATTN_ACC64_OPERANDS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
  if constexpr (kN == 176 && kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 " ROSETTA_ATTN_ACC88
                 ", %88, %89, p, 1, 1, 0, 0;\n}\n"
                 : ROSETTA_ATTN_ACC88_OPERANDS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
  if constexpr (kN == 176 && !kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 " ROSETTA_ATTN_ACC88
                 ", %88, %89, p, 1, 1, 0, 0;\n}\n"
                 : ROSETTA_ATTN_ACC88_OPERANDS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
}

// d += A B: A (64 x 16) from registers in mma.m16n8k16's A layout per warp (warp w: rows 16w..;
// a[0] = (row g, k 2t, 2t+1), a[1] = (row g+8, same k), a[2] = (row g, k 2t+8, +9), a[3] = (row
// g+8, k 2t+8, +9); the lower k in the low 16 bits), B (16 x kN) MN-major in shared memory
// (transpose bit set: its rows are k, each holding kN contiguous n values).
template <typename T, int kN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(kN == 64 || kN == 128, "the instantiated widths");
  constexpr bool kF16 = std::is_same_v<T, __half>;
  if constexpr (kN == 128 && kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ROSETTA_ATTN_ACC64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : ROSETTA_ATTN_ACC64_OPERANDS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
  }
  if constexpr (kN == 128 && !kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ROSETTA_ATTN_ACC64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : ROSETTA_ATTN_ACC64_OPERANDS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
  }
  if constexpr (kN == 64 && kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " ROSETTA_ATTN_ACC32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : ROSETTA_ATTN_ACC32_OPERANDS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
  }
  if constexpr (kN == 64 && !kF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ROSETTA_ATTN_ACC32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : ROSETTA_ATTN_ACC32_OPERANDS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
  }
}

#undef ROSETTA_ATTN_ACC32
#undef ROSETTA_ATTN_ACC32_OPERANDS
#undef ROSETTA_ATTN_ACC64
#undef ROSETTA_ATTN_ACC64_OPERANDS
#undef ROSETTA_ATTN_ACC88
#undef ROSETTA_ATTN_ACC88_OPERANDS

}  // namespace rosetta::attention_sm90
