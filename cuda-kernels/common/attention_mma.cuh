// Tensor-core pieces of the attention ladder (cuda-kernels/attention/, step 3 on): the PTX that
// matmul step 10 taught (cp.async with zero-fill, ldmatrix, mma.sync.m16n8k16 over XOR-swizzled
// shared tiles), here as reusable functions, plus the three operand patterns attention needs.
// (matmul step 10 keeps its copies in its own file, so this header does not include it.)
//
// Fragment layouts relied on (PTX ISA, mma.m16n8k16 with 16-bit inputs; g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major)  a0: (row g,   k 2t, 2t+1)   a1: (row g+8, k 2t, 2t+1)
//                           a2: (row g,   k 2t+8, +9)   a3: (row g+8, k 2t+8, +9)
//   B (16 x 8,  "col")      b0: (k 2t, 2t+1, col g)     b1: (k 2t+8, 2t+9, col g)
//   C (16 x 8, fp32)        c0, c1: (row g, col 2t, 2t+1)   c2, c3: (row g+8, col 2t, 2t+1)
// Each 32-bit register holds the lower column (or k) in its low 16 bits. Hence the identity the
// kernels use: the C tiles 2kk and 2kk+1 of a 16-row strip (columns 16kk .. 16kk+15), packed in
// pairs (c0,c1), (c2,c3), are exactly the A fragment a0, a1 (tile 2kk), a2, a3 (tile 2kk+1) of
// k-step kk: a score tile becomes the next MMA's left operand without leaving registers.
//   ldmatrix.x4: lanes 8i .. 8i+7 give the 8 row addresses (16 bytes each) of matrix i; register
//   i of lane l then holds matrix i's (row g, columns 2t, 2t+1); with .trans (rows 2t, 2t+1,
//   column g), i.e. the B layout of a matrix stored k-major.
#pragma once

#include <cstring>
#include <type_traits>

#include "rosetta.cuh"

namespace rosetta {
namespace attention_mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of 16-byte chunk `chunk` of row `row` in a tile of kRowElems (64 or 128) 16-bit
// elements a row. The chunk's low 3 bits are XORed with row % 8: the 8 rows an ldmatrix phase
// reads at one logical chunk sit in 8 distinct 16-byte bank groups (rows are 128 or 256 bytes,
// so without the swizzle all 8 would hit the same 4 banks).
template <int kRowElems>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kRowElems % 64 == 0, "rows of whole 128-byte lines");
  return row * kRowElems + ((chunk ^ (row % 8)) * 8);
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// 8 elements src[0..7] into the 16-byte shared slot dst, or zeros when !valid. vec: cp.async
// (src 16-byte aligned); src-size 0 zero-fills without reading (fallback, a valid pointer, is
// passed instead of src). Otherwise 8 scalar loads and one synchronous 16-byte shared store.
template <typename T>
__device__ __forceinline__ void load_chunk(T* dst, const T* src, const T* fallback, bool valid, bool vec) {
  if (vec) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(valid ? src : fallback), "r"(valid ? 16 : 0) : "memory");
  } else {
    uint4 packed = make_uint4(0u, 0u, 0u, 0u);
    if (valid) {
      T v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = src[e];
      memcpy(&packed, v, 16);
    }
    *reinterpret_cast<uint4*>(dst) = packed;
  }
}

// Rows row0 .. row0 + kRows - 1 of a (rows x kD) matrix with row stride `stride` (elements) into
// the swizzled tile dst; rows >= limit are zero-filled. kThreads threads share the chunks; 8 or 16
// consecutive threads read one row's 128 or 256 contiguous bytes (coalesced).
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* dst, const T* base, int64_t stride, int row0, int limit, bool vec) {
  constexpr int kChunksRow = kD / 8, kChunks = kRows * kChunksRow;
  static_assert(kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads, r = c / kChunksRow, ch = c % kChunksRow;
    const int row = row0 + r;
    const bool valid = row < limit;
    load_chunk(dst + swizzle<kD>(r, ch), valid ? base + int64_t(row) * stride + ch * 8 : base, base, valid, vec);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// The three operand patterns, on a swizzled tile with kD elements a row:
// A fragment of rows row0 .. row0+15, k columns 16kk .. 16kk+15 (the tile is the row-major left
// operand: Q, dO, K, V as "rows x head_dim"). Lanes 0-15 address rows 0-15 at chunk 2kk, lanes
// 16-31 the same rows at chunk 2kk+1: matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7,
// k hi), (rows 8-15, k hi) = a0..a3.
template <int kD, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int row0, int kk, int lane) {
  ldmatrix_x4(a, tile + swizzle<kD>(row0 + lane % 16, 2 * kk + lane / 16));
}
// B fragments of two n8 tiles when the tile's rows are the n index and its columns the k index
// (K for S = Q K^T: B = K^T): rows n0 .. n0+15, k columns 16kk .. +15. Matrices: (n 0-7, k lo) =
// b0 of tile n0, (n 0-7, k hi) = b1 of it, (n 8-15, k lo), (n 8-15, k hi) = b0, b1 of tile n0+8.
// b[0], b[1]: n tile n0 / 8; b[2], b[3]: n tile n0 / 8 + 1.
template <int kD, typename T>
__device__ __forceinline__ void load_b_rows_n(uint32_t (&b)[4], const T* tile, int n0, int kk, int lane) {
  ldmatrix_x4(b, tile + swizzle<kD>(n0 + (lane / 16) * 8 + lane % 8, 2 * kk + (lane / 8) % 2));
}
// B fragments of two n8 tiles when the tile's rows are the k index and its columns the n index
// (V for O = P V): k rows 16kk .. +15, n columns 16jj .. +15, through ldmatrix.trans. Matrices:
// (k 0-7, n chunk 2jj), (k 8-15, n chunk 2jj) = b0, b1 of n tile 2jj; the same at chunk 2jj+1.
template <int kD, typename T>
__device__ __forceinline__ void load_b_rows_k(uint32_t (&b)[4], const T* tile, int kk, int jj, int lane) {
  ldmatrix_x4_trans(b, tile + swizzle<kD>(16 * kk + lane % 16, 2 * jj + lane / 16));
}

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, lo in the low 16 bits (the lower column: the fragment convention).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const T v[2] = {from_float<T>(lo), from_float<T>(hi)};
  uint32_t r;
  memcpy(&r, v, 4);
  return r;
}

// A fragment of k-step kk from the fp32 C tiles c[2kk], c[2kk+1] of a 16-row strip (the C -> A
// identity above), rounded to T.
template <typename T, int kTiles>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[kTiles][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// Writes a warp's 16 x kD fp32 accumulators acc[kD/8][4] (rows row0 .. row0+15 of a swizzled
// tile) as T into that tile, then copies those 16 rows to global rows grow0 .. (those < limit)
// of dst (row stride `stride`), 16 bytes at a time when vec (dst and stride 16-byte aligned).
// The tile rows must be the warp's own (no other warp reads them now); scale multiplies row
// half h (rows g, g+8) by scale[h].
template <int kD, typename T>
__device__ __forceinline__ void store_rows(T* tile, int row0, const float (&acc)[kD / 8][4], const float (&scale)[2],
                                           T* dst, int64_t stride, int grow0, int limit, bool vec, int lane) {
  __syncwarp();  // the warp's earlier ldmatrix reads of these rows are done
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + lane / 4 + 8 * h;
      *reinterpret_cast<uint32_t*>(tile + swizzle<kD>(r, nt) + 2 * (lane % 4)) =
          pack2<T>(acc[nt][2 * h] * scale[h], acc[nt][2 * h + 1] * scale[h]);
    }
  __syncwarp();
  constexpr int kChunksRow = kD / 8;
#pragma unroll
  for (int i = 0; i < 16 * kChunksRow / 32; ++i) {
    const int c = lane + 32 * i, r = c / kChunksRow, ch = c % kChunksRow;
    const int row = grow0 + r;
    if (row >= limit) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + swizzle<kD>(row0 + r, ch));
    T* out = dst + int64_t(row) * stride + ch * 8;
    if (vec) {
      *reinterpret_cast<uint4*>(out) = v;
    } else {
      T e[8];
      memcpy(e, &v, 16);
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = e[k];
    }
  }
}

}  // namespace attention_mma
}  // namespace rosetta
