// Pieces the rms_norm and layer_norm ladders share (the two take the same steps), each taught by
// the first step that uses it:
//   column_sums                 a column's sum over rows in a fixed order: dweight, dbias    step 1
//   Tile, fetch, GroupSum       a row held in registers by a warp or a block, 16-byte vectors,
//                               and the group's all-reduce (one value or a pair)              step 2
//   reduce_partials             the per-block fp32 partial rows summed in a fixed order       step 2
//   pick_*_tile, plan_chunks    the register tiles by row length; the backward's row chunks   step 2
// Both ops keep fp32 statistics (mean, rstd) and do every sum in fp32 whatever the element type.
// Everything here is deterministic: a sum's order depends on the shape and the grid, never on
// timing (no float atomics), so a run gives the same bits every time.
// a row's 16-byte vectors come from softmax step 3 (load_vec / store_vec, in softmax.cuh).
#pragma once

#include <type_traits>

#include "softmax.cuh"

namespace rosetta::norm {

using softmax::kVec;
using softmax::load_vec;
using softmax::rows_aligned;
using softmax::store_vec;

template <int N> using Int = std::integral_constant<int, N>;

// ---------------------------------------------------------------------------------------------
// Column sums (step 1)

// A block sums kColumns neighbouring columns over every row: thread (x, y) takes column
// blockIdx.x * kColumns + x and rows y, y + kSlices, ..., in order; the kSlices partial sums of a
// column then add up in slice order. A warp is one slice: its 32 lanes read 32 neighbouring
// elements of a row (coalesced). The order depends on rows only, so the bits never change.
constexpr int kColumns = 32;
constexpr int kSlices = 8;

// term(r, c, acc) adds row r's terms of column c into acc[0 .. kSums); out(c, total) writes them.
template <int kSums, typename Term, typename Out>
__device__ __forceinline__ void column_sums(int64_t rows, int64_t cols, Term term, Out out) {
  __shared__ float part[kSums][kSlices][kColumns];
  const int64_t c = int64_t(blockIdx.x) * kColumns + threadIdx.x;
  float acc[kSums];
#pragma unroll
  for (int s = 0; s < kSums; ++s) acc[s] = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kSlices) term(r, c, acc);
#pragma unroll
  for (int s = 0; s < kSums; ++s) part[s][threadIdx.y][threadIdx.x] = acc[s];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total[kSums];
#pragma unroll
    for (int s = 0; s < kSums; ++s) {
      total[s] = part[s][0][threadIdx.x];
#pragma unroll
      for (int j = 1; j < kSlices; ++j) total[s] += part[s][j][threadIdx.x];
    }
    out(c, total);
  }
}

inline dim3 column_block() { return dim3(kColumns, kSlices); }
inline unsigned column_grid(int64_t cols) { return unsigned(ceil_div(cols, kColumns)); }

// ---------------------------------------------------------------------------------------------
// A row in registers (step 2)

// The longest row the register tiles hold: the backward keeps x, dy and the dweight (and dbias)
// sums in registers, 4 x 16 fp32 values a thread at 512 threads (pick_backward_tile).
constexpr int64_t kMaxRegisterCols = 8192;

// A group (a warp, or the whole block) holds a row: thread t of kGroup holds 16-byte vectors
// t, t + kGroup, ... (neighbouring threads, neighbouring vectors: coalesced), kElems fp32 values.
// Elements past the row's end hold 0.
template <typename T, int kGroup, int kElems>
struct Tile {
  static constexpr int V = kVec<T>, kVecs = kElems / V;
  static_assert(kElems % V == 0 && kVecs >= 1, "whole 16-byte vectors per thread");
  float v[kVecs][V];

  static __device__ __forceinline__ int64_t col(int i, int t) { return (int64_t(i) * kGroup + t) * V; }
  static __device__ __forceinline__ bool valid(int i, int k, int t, int64_t cols) { return col(i, t) + k < cols; }

  // kWhole: the host checked that every row starts on 16 bytes and cols % V == 0, so each vector
  // is wholly inside the row or wholly past it: one 16-byte load or zeros, no element-wise branch.
  // Otherwise load_vec decides per vector (an unaligned row, the vector across the end).
  // All kVecs loads issue before the first conversion uses one.
  template <bool kWhole>
  __device__ __forceinline__ void load(const T* row, int64_t cols, int t) {
    if constexpr (kWhole) {
      Vec16<T> p[kVecs];
#pragma unroll
      for (int i = 0; i < kVecs; ++i)
        p[i].raw = col(i, t) < cols ? *reinterpret_cast<const uint4*>(row + col(i, t)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < kVecs; ++i)
#pragma unroll
        for (int k = 0; k < V; ++k) v[i][k] = p[i].get(k);
    } else {
      const bool vec = aligned16(row);
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const Vec16<T> p = load_vec(row, col(i, t), cols, vec, 0.0f);
#pragma unroll
        for (int k = 0; k < V; ++k) v[i][k] = p.get(k);
      }
    }
  }

  template <bool kWhole>
  __device__ __forceinline__ void store(T* row, int64_t cols, int t) const {
    const bool vec = kWhole || aligned16(row);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      Vec16<T> p;
#pragma unroll
      for (int k = 0; k < V; ++k) p.set(k, v[i][k]);
      if constexpr (kWhole) {
        if (col(i, t) < cols) *reinterpret_cast<uint4*>(row + col(i, t)) = p.raw;
      } else {
        store_vec(row, col(i, t), cols, vec, p);
      }
    }
  }
};

// x and dy of a backward row: every load of both issues before the first conversion.
template <bool kWhole, typename Tile, typename T>
__device__ __forceinline__ void load_pair(Tile& a, const T* ra, Tile& b, const T* rb, int64_t cols, int t) {
  if constexpr (kWhole) {
    Vec16<T> pa[Tile::kVecs], pb[Tile::kVecs];
#pragma unroll
    for (int i = 0; i < Tile::kVecs; ++i) {
      const int64_t c = Tile::col(i, t);
      pa[i].raw = c < cols ? *reinterpret_cast<const uint4*>(ra + c) : make_uint4(0, 0, 0, 0);
      pb[i].raw = c < cols ? *reinterpret_cast<const uint4*>(rb + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < Tile::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Tile::V; ++k) a.v[i][k] = pa[i].get(k), b.v[i][k] = pb[i].get(k);
  } else {
    a.template load<false>(ra, cols, t);
    b.template load<false>(rb, cols, t);
  }
}

// One 16-byte vector of weight or bias (1-D, cols long) at column c, 0 past the end. The same
// vector every row: after the first row it comes from L1. `vec`: the tensor starts on 16 bytes.
template <bool kWhole, typename T>
__device__ __forceinline__ Vec16<T> fetch(const T* p, int64_t c, int64_t cols, bool vec) {
  if constexpr (kWhole) {
    Vec16<T> v;
    v.raw = c < cols ? *reinterpret_cast<const uint4*>(p + c) : make_uint4(0, 0, 0, 0);
    return v;
  } else {
    return load_vec(p, c, cols, vec, 0.0f);
  }
}

// The group's all-reduce, of one value or of a pair (the layer_norm backward's two sums share
// one round of shuffles and barriers). A warp: shuffles only. A block: shuffles, one shared array
// of kGroup / 32 pairs and two barriers, the second so the next call may reuse the array at once.
// Every thread gets bit-identical sums (the butterfly adds the same operands on both sides).
template <int kGroup>
struct GroupSum {
  float2* scratch;  // kGroup / 32 pairs; unused by a warp

  __device__ __forceinline__ float operator()(float v) const {
    if constexpr (kGroup == 32) return warp_sum(v);
    else return block_reduce<kGroup, Sum>(v, reinterpret_cast<float*>(scratch));
  }
  __device__ __forceinline__ float2 operator()(float2 v) const {
    v.x = warp_sum(v.x);
    v.y = warp_sum(v.y);
    if constexpr (kGroup > 32) {
      static_assert(kGroup % 32 == 0 && kGroup <= 1024, "whole warps, at most 32 of them");
      const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
      if (lane == 0) scratch[warp] = v;
      __syncthreads();
      v = lane < kGroup / 32 ? scratch[lane] : make_float2(0.0f, 0.0f);
      v.x = warp_sum(v.x);
      v.y = warp_sum(v.y);
      __syncthreads();
    }
    return v;
  }
};

// A warp-tile block holds kWarpRows warps, a row each; a block tile is one group of kThreads.
constexpr int kWarpRows = 4;

// The register tiles by row length: warp(kElems) runs a warp per row (kWarpRows rows a block),
// block(kThreads, kElems) a block per row (the numbers as Int<>). False past kMaxRegisterCols.
// Forward: one tile (x) a thread, <= 16 values; weight and bias come a vector at a time.
template <typename T, typename Warp, typename Block>
bool pick_forward_tile(int64_t cols, Warp warp, Block block) {
  constexpr int V = kVec<T>;
  if (cols <= 32 * V) warp(Int<V>{});
  else if (cols <= 64 * V) warp(Int<2 * V>{});
  else if (cols <= 128 * V) warp(Int<4 * V>{});  // 16-bit: 1,024; fp32: 512
  else if (cols <= 2048) block(Int<256>{}, Int<8>{});
  else if (cols <= 4096) block(Int<256>{}, Int<16>{});
  else if (cols <= kMaxRegisterCols) block(Int<512>{}, Int<16>{});
  else return false;
  return true;
}

// Backward: x, dy, and one (rms_norm) or two (layer_norm) fp32 sums per element a thread owns, so
// at most 16 values a tensor (4 x 16 + addresses fit the 128 registers of a 512-thread block).
// Warp tiles only to 2 vectors a lane for the same reason; longer short rows take a small block.
template <typename T, typename Warp, typename Block>
bool pick_backward_tile(int64_t cols, Warp warp, Block block) {
  constexpr int V = kVec<T>;
  if (cols <= 32 * V) warp(Int<V>{});
  else if (cols <= 64 * V) warp(Int<2 * V>{});  // 16-bit: 512; fp32: 256
  else if (cols <= 1024) block(Int<128>{}, Int<8>{});
  else if (cols <= 2048) block(Int<256>{}, Int<8>{});
  else if (cols <= 4096) block(Int<256>{}, Int<16>{});
  else if (cols <= kMaxRegisterCols) block(Int<512>{}, Int<16>{});
  else return false;
  return true;
}

// f(std::true_type) on the whole-vector path, f(std::false_type) otherwise.
template <typename F>
void by_path(bool whole, F f) {
  if (whole) f(std::true_type{});
  else f(std::false_type{});
}

// The backward's row split: `blocks` blocks, each a contiguous chunk of `chunk` rows (the last
// may be shorter, none empty). As many blocks as fit on the machine at once (one wave: every
// block's partial row is a row the reduction reads, so no more than can run together), no more
// than there are rows for the groups of a block.
struct Chunks {
  int64_t chunk;
  unsigned blocks;
};

template <typename Kernel>
Chunks plan_chunks(Kernel kernel, int threads, int64_t rows, int rows_per_block) {
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
  const int64_t resident = int64_t(std::max(per_sm, 1)) * sm_count();
  const int64_t want = std::min<int64_t>(ceil_div(rows, rows_per_block), resident);
  const int64_t chunk = ceil_div(rows, want);
  return {chunk, unsigned(ceil_div(rows, chunk))};
}

// ---------------------------------------------------------------------------------------------
// The partial rows' reduction (step 2)

// partial holds kSums stacked blocks of `parts` rows x cols fp32 sums (dweight's, then dbias's);
// out0 (and out1) get their column sums in row order, rounded once to T.
template <typename T, int kSums>
__global__ void __launch_bounds__(kColumns * kSlices)
reduce_partials(const float* __restrict__ partial, int64_t parts, int64_t cols, T* __restrict__ out0,
                T* __restrict__ out1) {
  column_sums<kSums>(
      parts, cols,
      [&](int64_t r, int64_t c, float* acc) {
#pragma unroll
        for (int s = 0; s < kSums; ++s) acc[s] += partial[(s * parts + r) * cols + c];
      },
      [&](int64_t c, const float* total) {
        out0[c] = from_float<T>(total[0]);
        if constexpr (kSums == 2) out1[c] = from_float<T>(total[1]);
      });
}

// Backward with no rows: dweight (and dbias) are sums of nothing. All-zero bits are 0.0 in fp32,
// fp16 and bf16.
inline cudaError_t zero(const Tensor& t, cudaStream_t stream) {
  const int64_t bytes = t.numel * (t.dtype == DType::f32 ? 4 : 2);
  return bytes == 0 ? cudaSuccess : cudaMemsetAsync(t.data, 0, size_t(bytes), stream);
}

}  // namespace rosetta::norm
