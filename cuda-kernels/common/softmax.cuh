// Pieces of the softmax ladder that later steps share, each taught by the first step that uses it:
//   load_vec / store_vec           a row's 16-byte vectors, masked and scalar off the aligned path  step 3
//   Online, merge, block_merge     (max, sum of exp) pairs merged in one pass, -inf-safe           step 4
//   softmax_online, dot_backward   block per row: 2 reads + 1 write forward, 2 + 2 + 1 backward    step 4
//   max_dynamic_smem               the opt-in shared memory a block may ask for                    step 5
//   launch_*_in_registers          warp per row (<= 1,024) and block per row (<= 16,384) with the
//                                  row in registers: 1 read + 1 write, 2 + 1 backward; rows of
//                                  whole, aligned vectors take branch-free instantiations        step 5
//   rows_aligned                   every row of a view starts on 16 bytes                         step 5
//   launch_forward / _backward     the host side of steps 5-8: empty inputs, step 5's tiles, else
//                                  the step's own kernels for longer rows                        step 5
// Every kernel takes rows x cols with a row stride for its inputs (Layout: rows) and contiguous
// outputs; rows and the offsets into them are 64-bit.
#pragma once

#include <algorithm>
#include <type_traits>

#include "primitives.cuh"

namespace rosetta::softmax {

template <typename T> constexpr int kVec = Vec16<T>::kCount;  // elements per 16-byte vector

// ---------------------------------------------------------------------------------------------
// Row access (step 3)

// Elements [c, c + kVec) of a row of n: one 16-byte load when the row starts 16-byte aligned
// (`vec`; c is a multiple of kVec) and the vector lies inside the row, else one element at a
// time with `fill` past the end (-inf: adds nothing to a max or, after exp, to a sum).
template <typename T>
__device__ __forceinline__ Vec16<T> load_vec(const T* row, int64_t c, int64_t n, bool vec, float fill) {
  Vec16<T> v;
  if (vec && c + kVec<T> <= n) {
    v.raw = *reinterpret_cast<const uint4*>(row + c);
  } else {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) v.set(k, c + k < n ? to_float(row[c + k]) : fill);
  }
  return v;
}

// The store that matches load_vec: elements at or past n are not written.
template <typename T>
__device__ __forceinline__ void store_vec(T* row, int64_t c, int64_t n, bool vec, const Vec16<T>& v) {
  if (vec && c + kVec<T> <= n) {
    *reinterpret_cast<uint4*>(row + c) = v.raw;
  } else {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k)
      if (c + k < n) row[c + k] = reinterpret_cast<const T*>(&v.raw)[k];
  }
}

// ---------------------------------------------------------------------------------------------
// Online softmax (step 4): Milakov & Gimelshein 2018. A pair (m, d) stands for "max m, and the
// sum of exp(x - m)"; two pairs merge without a second look at the data.

// The reference that exp(x - ref) is taken against. A max still at -inf has only seen -inf (or
// NaN): exp(-inf - -inf) would be NaN and poison every later element, so such a pair is kept
// against 0 instead, where its -inf elements add exp(-inf) = 0 (a NaN still adds NaN).
__device__ __forceinline__ float reference(float m) { return m == -INFINITY ? 0.0f : m; }

struct Online {
  float m, d;  // no initialisers: an aggregate, so __shared__ arrays of it are legal

  static __device__ __forceinline__ Online empty() { return {-INFINITY, 0.0f}; }  // merge's identity

  // One vector of elements: its max first, then a single rescale of the running sum.
  template <typename T>
  __device__ __forceinline__ void add(const Vec16<T>& v) {
    float vmax = v.get(0);
#pragma unroll
    for (int k = 1; k < kVec<T>; ++k) vmax = fmaxf(vmax, v.get(k));  // fmaxf skips NaN: d catches it
    const float m_new = fmaxf(m, vmax), ref = reference(m_new);
    float s = d * __expf(m - ref);  // m = -inf: 0 * exp(-inf) = 0; m = m_new = +inf: NaN, as torch
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) s += __expf(v.get(k) - ref);
    m = m_new;
    d = s;
  }
};

__device__ __forceinline__ Online merge(const Online& a, const Online& b) {
  Online r;
  r.m = fmaxf(a.m, b.m);
  const float ref = reference(r.m);
  r.d = a.d * __expf(a.m - ref) + b.d * __expf(b.m - ref);
  return r;
}

// Butterfly over the warp. Both partners compute merge(lower lane, upper lane) -- the same
// operands in the same order -- so every lane ends with bit-identical (m, d).
__device__ __forceinline__ Online warp_merge(Online a) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    Online b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, offset);
    b.d = __shfl_xor_sync(0xffffffffu, a.d, offset);
    a = (lane & offset) ? merge(b, a) : merge(a, b);
  }
  return a;
}

// Every thread gets the block's pair. `scratch` holds kThreads / 32 pairs; the trailing barrier
// lets the caller reuse it at once (as rosetta::block_reduce does).
template <int kThreads>
__device__ __forceinline__ Online block_merge(Online a, Online* scratch) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32 of them");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  a = warp_merge(a);
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  a = warp_merge(lane < kThreads / 32 ? scratch[lane] : Online::empty());
  __syncthreads();
  return a;
}

// ---------------------------------------------------------------------------------------------
// Step 4's kernels: a block per row, any row length. Steps 5 and 6 fall back to them for rows
// longer than what an SM (or a cluster) holds.

constexpr int kOnlineThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kOnlineThreads)
softmax_online(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int64_t cols) {
  constexpr int V = kVec<T>;
  __shared__ Online scratch[kOnlineThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // block-uniform: barriers inside
    const T* in = x + row * x_stride;
    T* o = out + row * cols;
    const bool vin = aligned16(in), vout = aligned16(o);
    Online t = Online::empty();  // read 1: max and sum together
    for (int64_t c = int64_t(threadIdx.x) * V; c < cols; c += kOnlineThreads * V)
      t.add(load_vec(in, c, cols, vin, -INFINITY));
    const Online r = block_merge<kOnlineThreads>(t, scratch);
    const float inv = 1.0f / r.d;
    for (int64_t c = int64_t(threadIdx.x) * V; c < cols; c += kOnlineThreads * V) {  // read 2, write
      Vec16<T> v = load_vec(in, c, cols, vin, -INFINITY);
#pragma unroll
      for (int k = 0; k < V; ++k) v.set(k, __expf(v.get(k) - r.m) * inv);  // r.m = -inf: NaN, as torch
      store_vec(o, c, cols, vout, v);
    }
  }
}

// dx = y * (dy - sum(y * dy)): one pass for the dot, one for dx.
template <typename T>
__global__ void __launch_bounds__(kOnlineThreads)
dot_backward(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
             T* __restrict__ dx, int64_t rows, int64_t cols) {
  constexpr int V = kVec<T>;
  __shared__ float scratch[kOnlineThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* yr = y + row * y_stride;
    const T* gr = dy + row * dy_stride;
    T* o = dx + row * cols;
    const bool vy = aligned16(yr), vg = aligned16(gr), vo = aligned16(o);
    float dot = 0.0f;
    for (int64_t c = int64_t(threadIdx.x) * V; c < cols; c += kOnlineThreads * V) {
      const Vec16<T> a = load_vec(yr, c, cols, vy, 0.0f), b = load_vec(gr, c, cols, vg, 0.0f);
#pragma unroll
      for (int k = 0; k < V; ++k) dot += a.get(k) * b.get(k);
    }
    dot = rosetta::block_reduce<kOnlineThreads, Sum>(dot, scratch);
    for (int64_t c = int64_t(threadIdx.x) * V; c < cols; c += kOnlineThreads * V) {
      const Vec16<T> a = load_vec(yr, c, cols, vy, 0.0f), b = load_vec(gr, c, cols, vg, 0.0f);
      Vec16<T> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.set(k, a.get(k) * (b.get(k) - dot));
      store_vec(o, c, cols, vo, r);
    }
  }
}

// Dynamic shared memory one block may opt in to (227 KB on an H100), less room for a kernel's
// static arrays. Per device, as rosetta::sm_count.
inline int64_t max_dynamic_smem() {
  static int optin[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (optin[device] == 0) cudaDeviceGetAttribute(&optin[device], cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return optin[device] - 1024;
}

// One block per row; the row loop inside covers grids capped at 2^31 - 1 blocks.
inline unsigned row_grid(int64_t rows, int64_t rows_per_block = 1) {
  return unsigned(std::min<int64_t>(ceil_div(rows, rows_per_block), INT32_MAX));
}

template <typename T>
void launch_online(const T* x, int64_t x_stride, T* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  softmax_online<T><<<row_grid(rows), kOnlineThreads, 0, stream>>>(x, x_stride, out, rows, cols);
}

template <typename T>
void launch_dot_backward(const T* y, int64_t y_stride, const T* dy, int64_t dy_stride, T* dx, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  dot_backward<T><<<row_grid(rows), kOnlineThreads, 0, stream>>>(y, y_stride, dy, dy_stride, dx, rows, cols);
}

// ---------------------------------------------------------------------------------------------
// Step 5: the row in registers. A "group" (a warp, or the whole block) owns a row; thread t of a
// group of kGroup threads holds vectors t, t + kGroup, ... (coalesced: neighbouring threads hold
// neighbouring 16-byte vectors), kElems fp32 values in all, loaded before any is used.

constexpr int kWarpRowThreads = 128;  // 4 warps, a row each

template <typename T, int kGroup, int kElems>
struct RowTile {
  static constexpr int V = kVec<T>, kVecs = kElems / V;
  static_assert(kElems % V == 0 && kVecs >= 1, "whole 16-byte vectors per thread");
  using Raw = Vec16<T>[kVecs];
  float v[kVecs][V];

  __device__ __forceinline__ int64_t col(int i, int t) const { return (int64_t(i) * kGroup + t) * V; }

  // kWhole: the host checked that every row starts on 16 bytes and cols % V == 0, so each vector
  // is wholly inside the row or wholly past its end: one predicated 16-byte load (`fill` past the
  // end) and no branch. Else vector by vector, element-wise where a vector is unaligned or crosses
  // the end. Raw vectors first, unpack() later: with two tiles, both tiles' loads issue before the
  // first conversion waits on one (load_pair).
  __device__ __forceinline__ void fetch(Raw& p, const T* row, int cols, int t, float fill) const {
    Vec16<T> pad;
#pragma unroll
    for (int k = 0; k < V; ++k) pad.set(k, fill);
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
      p[i].raw = int(col(i, t)) < cols ? *reinterpret_cast<const uint4*>(row + col(i, t)) : pad.raw;
  }
  __device__ __forceinline__ void unpack(const Raw& p) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = p[i].get(k);
  }
  template <bool kWhole>
  __device__ __forceinline__ void load(const T* row, int64_t cols, int t, float fill) {
    if constexpr (kWhole) {
      Raw p;
      fetch(p, row, int(cols), t, fill);
      unpack(p);
    } else {
      const bool vec = aligned16(row);
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {  // all kVecs loads issue before the first use below
        const Vec16<T> p = load_vec(row, col(i, t), cols, vec, fill);
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
        if (int(col(i, t)) < int(cols)) *reinterpret_cast<uint4*>(row + col(i, t)) = p.raw;
      } else {
        store_vec(row, col(i, t), cols, vec, p);
      }
    }
  }
};

// Both tiles of a backward row (y and dy, 0 past the end). On the whole-vector path every load of
// both issues before the first conversion; two load() calls on the element-wise path would wait
// for y's data before asking for dy's (each vector's branch keeps its conversion in front).
template <bool kWhole, typename Tile, typename T>
__device__ __forceinline__ void load_pair(Tile& a, const T* ra, Tile& b, const T* rb, int64_t cols, int t) {
  if constexpr (kWhole) {
    typename Tile::Raw pa, pb;
    a.fetch(pa, ra, int(cols), t, 0.0f);
    b.fetch(pb, rb, int(cols), t, 0.0f);
    a.unpack(pa);
    b.unpack(pb);
  } else {
    a.template load<false>(ra, cols, t, 0.0f);
    b.template load<false>(rb, cols, t, 0.0f);
  }
}

// max, then exp in place (one exp per element), then scale: the row is never read twice.
// reduce(v, Op) is the group's all-reduce (a warp's shuffles, or block_reduce).
template <typename Tile, typename Reduce>
__device__ __forceinline__ void softmax_tile(Tile& x, Reduce reduce) {
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < Tile::kVecs; ++i)
#pragma unroll
    for (int k = 0; k < Tile::V; ++k) m = fmaxf(m, x.v[i][k]);
  m = reduce(m, Max{});  // -inf only for an all -inf (or NaN) row: exp(NaN) below, as torch
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < Tile::kVecs; ++i)
#pragma unroll
    for (int k = 0; k < Tile::V; ++k) s += (x.v[i][k] = __expf(x.v[i][k] - m));  // padding: exp(-inf) = 0
  const float inv = __fdividef(1.0f, reduce(s, Sum{}));  // s >= 1 (or NaN): no IEEE slow path needed
#pragma unroll
  for (int i = 0; i < Tile::kVecs; ++i)
#pragma unroll
    for (int k = 0; k < Tile::V; ++k) x.v[i][k] *= inv;
}

// dx = y * (dy - dot), written over dy.
template <typename Tile, typename Reduce>
__device__ __forceinline__ void backward_tile(const Tile& y, Tile& dy, Reduce reduce) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < Tile::kVecs; ++i)
#pragma unroll
    for (int k = 0; k < Tile::V; ++k) dot += y.v[i][k] * dy.v[i][k];  // padding: 0 * 0
  dot = reduce(dot, Sum{});
#pragma unroll
  for (int i = 0; i < Tile::kVecs; ++i)
#pragma unroll
    for (int k = 0; k < Tile::V; ++k) dy.v[i][k] = y.v[i][k] * (dy.v[i][k] - dot);
}

struct WarpAllReduce {
  template <typename Op> __device__ __forceinline__ float operator()(float v, Op op) const {
    return rosetta::warp_reduce(v, op);
  }
};
template <int kThreads>
struct BlockAllReduce {
  float* scratch;
  template <typename Op> __device__ __forceinline__ float operator()(float v, Op op) const {
    return rosetta::block_reduce<kThreads>(v, scratch, op);
  }
};

// A warp per row, 4 rows per block; no block barrier, so warps past the last row just leave.
template <typename T, int kElems, bool kWhole>
__global__ void __launch_bounds__(kWarpRowThreads)
softmax_warp_row(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int64_t cols) {
  constexpr int kWarps = kWarpRowThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t step = int64_t(gridDim.x) * kWarps;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows; row += step) {
    RowTile<T, 32, kElems> tile;
    tile.template load<kWhole>(x + row * x_stride, cols, lane, -INFINITY);
    softmax_tile(tile, WarpAllReduce{});
    tile.template store<kWhole>(out + row * cols, cols, lane);
  }
}

// A block per row: block b takes row b (the host launches 2^31 - 1 rows at a time), no row loop.
// kMinBlocks blocks per SM caps the registers at 65,536 / (kMinBlocks x kThreads); 0 sets no cap.
// The tables below say why each tile has its cap.
template <typename T, int kThreads, int kElems, int kMinBlocks, bool kWhole>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
softmax_block_row(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  RowTile<T, kThreads, kElems> tile;
  tile.template load<kWhole>(x + blockIdx.x * x_stride, cols, threadIdx.x, -INFINITY);
  softmax_tile(tile, BlockAllReduce<kThreads>{scratch});
  tile.template store<kWhole>(out + blockIdx.x * cols, cols, threadIdx.x);
}

template <typename T, int kElems, bool kWhole>
__global__ void __launch_bounds__(kWarpRowThreads)
backward_warp_row(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                  T* __restrict__ dx, int64_t rows, int64_t cols) {
  constexpr int kWarps = kWarpRowThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t step = int64_t(gridDim.x) * kWarps;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows; row += step) {
    RowTile<T, 32, kElems> ty, tg;
    load_pair<kWhole>(ty, y + row * y_stride, tg, dy + row * dy_stride, cols, lane);
    backward_tile(ty, tg, WarpAllReduce{});
    tg.template store<kWhole>(dx + row * cols, cols, lane);
  }
}

template <typename T, int kThreads, int kElems, int kMinBlocks, bool kWhole>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
backward_block_row(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                   T* __restrict__ dx, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  RowTile<T, kThreads, kElems> ty, tg;
  load_pair<kWhole>(ty, y + blockIdx.x * y_stride, tg, dy + blockIdx.x * dy_stride, cols, threadIdx.x);
  backward_tile(ty, tg, BlockAllReduce<kThreads>{scratch});
  tg.template store<kWhole>(dx + blockIdx.x * cols, cols, threadIdx.x);
}

// The register tiles: warp(kElems) runs a warp per row, block(kThreads, kElems, kMinBlocks) a
// block per row (the numbers as std::integral_constant). kElems <= 32 fp32 values per thread and
// tensor. Picked per direction by the row length; false, and nothing called, past 16,384.
template <int N> using Int = std::integral_constant<int, N>;
constexpr int64_t kMaxRegisterCols = 16384;

// Warp tiles of 1, 2 or 4 16-byte vectors per lane: rows of up to 128 vectors.
template <typename T, typename Warp>
bool pick_warp_tile(int64_t cols, Warp warp) {
  constexpr int V = kVec<T>;
  if (cols <= 32 * V) warp(Int<V>{});
  else if (cols <= 64 * V) warp(Int<2 * V>{});
  else warp(Int<4 * V>{});
  return true;
}

// Forward. Warp tiles up to 1,024 columns, except fp32 rows of 513-1,024: 128-thread blocks of 8
// values, 16 blocks per SM (4096 x 1024 in a development run: 2,503 GB/s against the warp tile's
// 2,405). 256 x 16 tiles (2,049-4,096) of 16-bit types are capped at 32 registers, 8 blocks per
// SM where 40 registers allowed 6 (bf16 4096 x 4096: 2,979 against 2,738); fp32 would spill there.
template <typename T, typename Warp, typename Block>
bool pick_forward_tile(int64_t cols, Warp warp, Block block) {
  constexpr int V = kVec<T>;
  constexpr bool kHalf = sizeof(T) == 2;
  if (cols <= 128 * V) return pick_warp_tile<T>(cols, warp);  // 16-bit: every row up to 1,024
  if constexpr (V == 4)
    if (cols <= 1024) return block(Int<128>{}, Int<8>{}, Int<16>{}), true;
  if (cols <= 2048) block(Int<256>{}, Int<8>{}, Int<4>{});
  else if (cols <= 4096) block(Int<256>{}, Int<16>{}, Int<kHalf ? 8 : 4>{});
  else if (cols <= 8192) block(Int<256>{}, Int<32>{}, Int<4>{});
  else if (cols <= kMaxRegisterCols) block(Int<512>{}, Int<32>{}, Int<2>{});
  else return false;
  return true;
}

// Backward: two tiles (y and dy). fp32 rows of 513-1,024 run 256-thread blocks, one 16-byte vector
// per thread and tensor (4096 x 1024: 2,829 GB/s against the warp tile's 2,608); 256 x 16 is capped
// at 48 registers, 5 blocks per SM where the uncapped ~56 allow 4 (with per-vector loads a cap of
// 40 and 6 blocks measured best, bf16 4096 x 4096 3,065 against 2,976; load_pair's raw vectors
// spill at 40, and Triton's kernel for the same tile runs 48 and 5). The other tiles have no cap (0): ptxas picks (32-94 registers, no
// spills), where an explicit 1 block per SM let it take more (80 -> 96 for 256 x 32, and bf16
// 16384 x 8192 ran 4% slower).
template <typename T, typename Warp, typename Block>
bool pick_backward_tile(int64_t cols, Warp warp, Block block) {
  constexpr int V = kVec<T>;
  if (cols <= 128 * V) return pick_warp_tile<T>(cols, warp);
  if constexpr (V == 4)
    if (cols <= 1024) return block(Int<256>{}, Int<4>{}, Int<4>{}), true;
  if (cols <= 2048) block(Int<256>{}, Int<8>{}, Int<0>{});
  else if (cols <= 4096) block(Int<256>{}, Int<16>{}, Int<5>{});
  else if (cols <= 8192) block(Int<256>{}, Int<32>{}, Int<0>{});
  else if (cols <= kMaxRegisterCols) block(Int<512>{}, Int<32>{}, Int<0>{});
  else return false;
  return true;
}

// Every row of a rows x cols view with this row stride starts on 16 bytes.
template <typename T>
bool rows_aligned(const T* p, int64_t stride) {
  return aligned16(p) && stride % kVec<T> == 0;
}

// f(std::bool_constant<whole>): whole when every row of every tensor starts on 16 bytes and cols
// is a multiple of the vector width (the tiles' branch-free path).
template <typename F>
void by_wholeness(bool whole, F f) {
  if (whole) f(std::true_type{});
  else f(std::false_type{});
}

// Block-per-row grids, 2^31 - 1 rows a launch: launch(first row, blocks).
template <typename Launch>
void for_row_blocks(int64_t rows, Launch launch) {
  for (int64_t first = 0; first < rows; first += INT32_MAX)
    launch(first, unsigned(std::min<int64_t>(rows - first, INT32_MAX)));
}

template <typename T>
bool launch_forward_in_registers(const T* x, int64_t x_stride, T* out, int64_t rows, int64_t cols,
                                 cudaStream_t stream) {
  const bool whole = cols % kVec<T> == 0 && rows_aligned(x, x_stride) && aligned16(out);
  return pick_forward_tile<T>(
      cols,
      [&](auto elems) {
        by_wholeness(whole, [&](auto w) {
          softmax_warp_row<T, decltype(elems)::value, decltype(w)::value>
              <<<row_grid(rows, kWarpRowThreads / 32), kWarpRowThreads, 0, stream>>>(x, x_stride, out, rows, cols);
        });
      },
      [&](auto threads, auto elems, auto min_blocks) {
        constexpr int kThreads = decltype(threads)::value;
        by_wholeness(whole, [&](auto w) {
          for_row_blocks(rows, [&](int64_t first, unsigned blocks) {
            softmax_block_row<T, kThreads, decltype(elems)::value, decltype(min_blocks)::value, decltype(w)::value>
                <<<blocks, kThreads, 0, stream>>>(x + first * x_stride, x_stride, out + first * cols, cols);
          });
        });
      });
}

template <typename T>
bool launch_backward_in_registers(const T* y, int64_t y_stride, const T* dy, int64_t dy_stride, T* dx,
                                  int64_t rows, int64_t cols, cudaStream_t stream) {
  const bool whole = cols % kVec<T> == 0 && rows_aligned(y, y_stride) && rows_aligned(dy, dy_stride) && aligned16(dx);
  return pick_backward_tile<T>(
      cols,
      [&](auto elems) {
        by_wholeness(whole, [&](auto w) {
          backward_warp_row<T, decltype(elems)::value, decltype(w)::value>
              <<<row_grid(rows, kWarpRowThreads / 32), kWarpRowThreads, 0, stream>>>(y, y_stride, dy, dy_stride, dx,
                                                                                      rows, cols);
        });
      },
      [&](auto threads, auto elems, auto min_blocks) {
        constexpr int kThreads = decltype(threads)::value;
        by_wholeness(whole, [&](auto w) {
          for_row_blocks(rows, [&](int64_t first, unsigned blocks) {
            backward_block_row<T, kThreads, decltype(elems)::value, decltype(min_blocks)::value, decltype(w)::value>
                <<<blocks, kThreads, 0, stream>>>(y + first * y_stride, y_stride, dy + first * dy_stride, dy_stride,
                                                  dx + first * cols, cols);
          });
        });
      });
}

// Host side of steps 5-8: nothing to write for an empty input; rows that step 5's register tiles
// hold take them; every other row goes to the step's own idea,
//   long_rows(T{}, x, x_stride, out) -> cudaError_t      (forward)
//   long_rows(T{}, y, y_stride, dy, dy_stride, dx)       (backward)
template <typename LongRows>
cudaError_t launch_forward(const SoftmaxArgs& a, cudaStream_t stream, LongRows long_rows) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    T* out = a.out.ptr<T>();
    if (!launch_forward_in_registers(x, a.x.stride[0], out, rows, cols, stream))
      status = long_rows(tag, x, a.x.stride[0], out);
  });
  return status != cudaSuccess ? status : launched;
}

template <typename LongRows>
cudaError_t launch_backward(const SoftmaxBackwardArgs& a, cudaStream_t stream, LongRows long_rows) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = dispatch_dtype(a.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* y = a.y.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    T* dx = a.dx.ptr<T>();
    if (!launch_backward_in_registers(y, a.y.stride[0], dy, a.dy.stride[0], dx, rows, cols, stream))
      status = long_rows(tag, y, a.y.stride[0], dy, a.dy.stride[0], dx);
  });
  return status != cudaSuccess ? status : launched;
}

}  // namespace rosetta::softmax
