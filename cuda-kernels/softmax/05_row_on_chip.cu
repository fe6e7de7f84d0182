/*
Step 5 — the row stays on chip: registers for short rows, shared memory for long ones
Changed:  the row is read once, kept on the SM while its max and sum are reduced, and written
          from there; the path is chosen by row length (as OneFlow's softmax):
            cols <= 1,024      a warp per row (4 rows per 128-thread block), each lane holding
                               4-32 fp32 values in registers: shuffles only, no barrier
                               (fp32 rows of 513-1,024: a small block per row measured faster).
            cols <= 16,384     a block per row (256 or 512 threads), <= 32 values per thread
                               in registers (compile-time tiles: 2K, 4K, 8K, 16K elements).
            row <= ~226 KB     a 512-thread block per row, the row in dynamic shared memory:
                               each thread stores 8 16-byte
                               vectors at a time (128 B in flight per thread), folding them
                               into step 4's online (max, sum) pair on the way in.
            longer             step 4's online kernel: 2 reads + 1 write.
          All tiles load every vector before using any; where every row starts on 16 bytes and
          cols is a multiple of the vector width (the host checks), the register tiles run an
          instantiation with one predicated 16-byte load per vector and no branch, and the
          backward issues all of y's and dy's loads before converting any. Backward: y and dy
          both stay on chip: 2 reads + 1 write. The register tiles give their loads an L2 priority (pick_load_hint: evict-
          last or evict-first by what overflows the L2). A row off 16 bytes is read as the
          16-byte vectors it overlaps, element-wise only in the first and last (sm::load_at);
          a tensor misaligned otherwise than the input is accessed element-wise.
Why:      2 reads + 1 write (3n) -> 1 read + 1 write (2n), the minimum: up to 3/2 faster where
          the second read came from DRAM, and for short rows it removes the L2 re-read that
          held step 4 below the DRAM ceiling. Bytes in flight: fp32 4096 x 4096 runs 256-thread
          blocks with 16 values a thread (~40 registers: 6 blocks x 16 KB = 96 KB per SM, far
          past the ~20 KB needed); 4096 x 1024 fits the whole problem in one wave of warps.
          Unaligned rows: one 16-byte load in place of 8 2-byte ones (4 for fp32), so 16-bit
          rows such as bf16 4096 x 50257 issue 8x fewer loads and stores (predicted: near the
          aligned rows' bandwidth).
Still:    rows longer than one SM's shared memory (bf16 4096 x 131072: 256 KB; fp32 4096 x
          262144: 1 MB) do not fit at all, and a 226 KB row leaves one block per SM whose load
          and write phases do not overlap. Step 6 spreads such a row over a thread-block cluster.
Limits:   rows past one SM's 227 KB of shared memory (fp32 > 58,112 elements, 16-bit > 116,224;
          backward, y and dy together, half that; rows off 16 bytes hold one vector more) are
          refused before launch (`Max: row_bytes`); step 4 (any row) and steps 6-8 (long rows)
          take them.
Layout:   rows
Max:      row_bytes <= 232448
*/
#include <type_traits>

#include "softmax.cuh"

namespace {

namespace sm = rosetta::softmax;
using rosetta::aligned16;
using rosetta::Max;
using rosetta::Sum;
using rosetta::Vec16;
using sm::kMaxRegisterCols;
using sm::kVec;
using sm::load_at;
using sm::row_grid;
using sm::rows_aligned;
using sm::shift;
using sm::store_at;

// ---------------------------------------------------------------------------------------------
// Rows of up to 16,384 elements: the row in registers. A "group" (a warp, or the whole block)
// owns a row; thread t of a group of kGroup threads holds vectors t, t + kGroup, ... (coalesced:
// neighbouring threads hold neighbouring 16-byte vectors), kElems fp32 values in all, loaded
// before any is used.

constexpr int kWarpRowThreads = 128;  // 4 warps, a row each

// The L2 eviction priority of a load's lines: evict-first (ld.global.cs) or evict-last (an L2
// cache policy made by createpolicy, passed to ld.global as a cache hint). pick_load_hint says
// when each one pays.
enum class L2Hint { kNormal, kEvictFirst, kEvictLast };

template <L2Hint kHint>
__device__ __forceinline__ uint4 load_hinted(const uint4* p) {
  if constexpr (kHint == L2Hint::kEvictFirst) {
    return __ldcs(p);
  } else if constexpr (kHint == L2Hint::kEvictLast) {
    uint64_t policy;
    uint4 v;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
    return v;
  } else {
    return *p;
  }
}

template <typename T, int kGroup, int kElems>
struct RowTile {
  static constexpr int V = kVec<T>, kVecs = kElems / V;
  static_assert(kElems % V == 0 && kVecs >= 1, "whole 16-byte vectors per thread");
  using Raw = Vec16<T>[kVecs];
  float v[kVecs][V];

  __device__ __forceinline__ int64_t col(int i, int t) const { return (int64_t(i) * kGroup + t) * V; }

  // kWhole: the host checked that every row starts on 16 bytes and cols % V == 0, so each vector
  // is wholly inside the row or wholly past its end: one predicated 16-byte load (`fill` past the
  // end) and no branch. Else vector by vector through the row's shifted vectors (load_at: s
  // elements before the row, 16-byte loads where `vec`), element-wise where a vector crosses
  // an end. Raw vectors first, unpack() later: with two tiles, both tiles' loads issue before the
  // first conversion waits on one (load_pair).
  // kHint: the L2 eviction priority the loads give their lines (see pick_load_hint).
  template <L2Hint kHint>
  __device__ __forceinline__ void fetch(Raw& p, const T* row, int cols, int t, float fill) const {
    Vec16<T> pad;
#pragma unroll
    for (int k = 0; k < V; ++k) pad.set(k, fill);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const uint4* src = reinterpret_cast<const uint4*>(row + col(i, t));
      p[i].raw = int(col(i, t)) < cols ? load_hinted<kHint>(src) : pad.raw;
    }
  }
  __device__ __forceinline__ void unpack(const Raw& p) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = p[i].get(k);
  }
  template <bool kWhole, L2Hint kHint>
  __device__ __forceinline__ void load(const T* row, int64_t cols, int t, float fill, int s, bool vec) {
    if constexpr (kWhole) {
      Raw p;
      fetch<kHint>(p, row, int(cols), t, fill);
      unpack(p);
    } else {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {  // all kVecs loads issue before the first use below
        const Vec16<T> p = load_at(row, s, i * kGroup + t, int(cols), vec, fill);
#pragma unroll
        for (int k = 0; k < V; ++k) v[i][k] = p.get(k);
      }
    }
  }
  template <bool kWhole>
  __device__ __forceinline__ void store(T* row, int64_t cols, int t, int s, bool vec) const {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      Vec16<T> p;
#pragma unroll
      for (int k = 0; k < V; ++k) p.set(k, v[i][k]);
      if constexpr (kWhole) {
        if (int(col(i, t)) < int(cols)) *reinterpret_cast<uint4*>(row + col(i, t)) = p.raw;
      } else {
        store_at(row, s, i * kGroup + t, int(cols), vec, p);
      }
    }
  }
};

// Both tiles of a backward row (y and dy, 0 past the end; the row's vectors `s` elements before
// it, each tile's 16-byte loads where its `vec`). On the whole-vector path every load of both
// issues before the first conversion; two load() calls on the element-wise path would wait for
// y's data before asking for dy's (each vector's branch keeps its conversion in front).
template <bool kWhole, L2Hint kHint, typename Tile, typename T>
__device__ __forceinline__ void load_pair(Tile& a, const T* ra, bool va, Tile& b, const T* rb, bool vb, int64_t cols,
                                          int t, int s) {
  if constexpr (kWhole) {
    typename Tile::Raw pa, pb;
    a.template fetch<kHint>(pa, ra, int(cols), t, 0.0f);
    b.template fetch<kHint>(pb, rb, int(cols), t, 0.0f);
    a.unpack(pa);
    b.unpack(pb);
  } else {
    a.template load<false, L2Hint::kNormal>(ra, cols, t, 0.0f, s, va);
    b.template load<false, L2Hint::kNormal>(rb, cols, t, 0.0f, s, vb);
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
template <typename T, int kElems, bool kWhole, L2Hint kHint>
__global__ void __launch_bounds__(kWarpRowThreads)
softmax_warp_row(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int64_t cols) {
  constexpr int kWarps = kWarpRowThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t step = int64_t(gridDim.x) * kWarps;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows; row += step) {
    const T* in = x + row * x_stride;
    const int s = kWhole ? 0 : shift(in);  // the input's own vectors; the output's too where it shares s
    RowTile<T, 32, kElems> tile;
    tile.template load<kWhole, kHint>(in, cols, lane, -INFINITY, s, true);
    softmax_tile(tile, WarpAllReduce{});
    T* o = out + row * cols;
    tile.template store<kWhole>(o, cols, lane, s, shift(o) == s);
  }
}

// A block per row: block b takes row b (the host launches 2^31 - 1 rows at a time), no row loop.
// kMinBlocks blocks per SM caps the registers at 65,536 / (kMinBlocks x kThreads); 0 sets no cap.
// The tables below say why each tile has its cap.
template <typename T, int kThreads, int kElems, int kMinBlocks, bool kWhole, L2Hint kHint>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
softmax_block_row(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  const T* in = x + blockIdx.x * x_stride;
  const int s = kWhole ? 0 : shift(in);
  RowTile<T, kThreads, kElems> tile;
  tile.template load<kWhole, kHint>(in, cols, threadIdx.x, -INFINITY, s, true);
  softmax_tile(tile, BlockAllReduce<kThreads>{scratch});
  T* o = out + blockIdx.x * cols;
  tile.template store<kWhole>(o, cols, threadIdx.x, s, shift(o) == s);
}

template <typename T, int kElems, bool kWhole, L2Hint kHint>
__global__ void __launch_bounds__(kWarpRowThreads)
backward_warp_row(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                  T* __restrict__ dx, int64_t rows, int64_t cols) {
  constexpr int kWarps = kWarpRowThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t step = int64_t(gridDim.x) * kWarps;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows; row += step) {
    const T* yr = y + row * y_stride;
    const T* gr = dy + row * dy_stride;
    const int s = kWhole ? 0 : sm::backward_shift(shift(yr), shift(gr), shift(dx + row * cols));
    RowTile<T, 32, kElems> ty, tg;
    load_pair<kWhole, kHint>(ty, yr, shift(yr) == s, tg, gr, shift(gr) == s, cols, lane, s);
    backward_tile(ty, tg, WarpAllReduce{});
    T* o = dx + row * cols;
    tg.template store<kWhole>(o, cols, lane, s, shift(o) == s);
  }
}

template <typename T, int kThreads, int kElems, int kMinBlocks, bool kWhole, L2Hint kHint>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
backward_block_row(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                   T* __restrict__ dx, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  const T* yr = y + blockIdx.x * y_stride;
  const T* gr = dy + blockIdx.x * dy_stride;
  const int s = kWhole ? 0 : sm::backward_shift(shift(yr), shift(gr), shift(dx + blockIdx.x * cols));
  RowTile<T, kThreads, kElems> ty, tg;
  load_pair<kWhole, kHint>(ty, yr, shift(yr) == s, tg, gr, shift(gr) == s, cols, threadIdx.x, s);
  backward_tile(ty, tg, BlockAllReduce<kThreads>{scratch});
  T* o = dx + blockIdx.x * cols;
  tg.template store<kWhole>(o, cols, threadIdx.x, s, shift(o) == s);
}

// The register tiles: warp(kElems) runs a warp per row, block(kThreads, kElems, kMinBlocks) a
// block per row (the numbers as std::integral_constant). kElems <= 32 fp32 values per thread and
// tensor. Picked per direction by the row length; false, and nothing called, past 16,384.
template <int N> using Int = std::integral_constant<int, N>;

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
// per thread and tensor (4096 x 1024: 2,829 GB/s against the warp tile's 2,608); 16-bit 256 x 16 is
// capped at 48 registers, 5 blocks per SM where the uncapped ~56 allow 4 (with per-vector loads a cap of
// 40 and 6 blocks measured best, bf16 4096 x 4096 3,065 against 2,976; load_pair's raw vectors
// spill at 40, and Triton's kernel for the same tile runs 48 and 5); fp32 rows of 2,049-4,096 run
// 512 x 8 (two vectors per tensor, 2 blocks per SM: fp32 4096 x 4096 with evict-last loads 62.5 us
// against 62.7 for 256 x 16, in turns, in development). The other tiles have no cap
// (0): ptxas picks (32-94 registers, no spills), where an explicit 1 block per SM let it take more
// (80 -> 96 for 256 x 32, and bf16 16384 x 8192 ran 4% slower).
template <typename T, typename Warp, typename Block>
bool pick_backward_tile(int64_t cols, Warp warp, Block block) {
  constexpr int V = kVec<T>;
  if (cols <= 128 * V) return pick_warp_tile<T>(cols, warp);
  if constexpr (V == 4)
    if (cols <= 1024) return block(Int<256>{}, Int<4>{}, Int<4>{}), true;
  if (cols <= 2048) {
    block(Int<256>{}, Int<8>{}, Int<0>{});
  } else if (cols <= 4096) {
    if constexpr (V == 4) block(Int<512>{}, Int<8>{}, Int<2>{});
    else block(Int<256>{}, Int<16>{}, Int<5>{});
  } else if (cols <= 8192) {
    block(Int<256>{}, Int<32>{}, Int<0>{});
  } else if (cols <= kMaxRegisterCols) {
    block(Int<512>{}, Int<32>{}, Int<0>{});
  } else {
    return false;
  }
  return true;
}

// The L2 priority of the loaded lines (the tiles' whole-vector path; the element-wise path loads
// plainly), from what the kernel reads and writes against the L2 (50 MB on an H100):
//   evict-last   the output overflows the L2. Its dirty lines are then evicted to DRAM during
//                the kernel; with the inputs' lines held back, more of them are still in L2 when
//                it ends (fp32 4096 x 4096 backward, ncu: 43.7 MB of dx's 64 MB written to DRAM
//                inside the kernel against 47.5 plain, reads unchanged) and are written back
//                after it. In turns, in development: that shape 62.5 us against 63.4 backward,
//                42.3 against 43.4 forward; bf16 16384 x 8192 257.6 against 259.9 backward,
//                175.1 against 176.6 forward. (torch.compile's backward gets the same from its
//                evict_last loads.)
//   evict-first  the inputs overflow the L2 but the output fits in 3/4 of it (the backward's y and
//                dy: ld.global.cs): the inputs, read once, are then what the L2 gives up as they
//                stream through, and dx stays there until the kernel ends. bf16 4096 x 4096 (64 MB
//                in, 32 MB out): 29.7 us against 30.9 in development; where dx does not fit (fp32
//                4096 x 4096) it costs 2%.
//   normal       everything else (fp32 4096 x 1024, bf16 4096 x 4096 forward: no hint measured
//                better).
inline L2Hint pick_load_hint(int64_t in_bytes, int64_t out_bytes) {
  const int64_t l2 = rosetta::device_attribute<cudaDevAttrL2CacheSize>();
  if (out_bytes > l2) return L2Hint::kEvictLast;
  return in_bytes > l2 && 4 * out_bytes <= 3 * l2 ? L2Hint::kEvictFirst : L2Hint::kNormal;
}

template <L2Hint kHint> using Hint = std::integral_constant<L2Hint, kHint>;

// f(whole, hint) as integral constants: the hint only on the whole-vector path.
template <typename F>
void by_path(bool whole, L2Hint hint, F f) {
  if (!whole) f(std::false_type{}, Hint<L2Hint::kNormal>{});
  else if (hint == L2Hint::kEvictFirst) f(std::true_type{}, Hint<L2Hint::kEvictFirst>{});
  else if (hint == L2Hint::kEvictLast) f(std::true_type{}, Hint<L2Hint::kEvictLast>{});
  else f(std::true_type{}, Hint<L2Hint::kNormal>{});
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
  const bool aligned = rows_aligned(x, x_stride), whole = cols % kVec<T> == 0 && aligned && aligned16(out);
  const int64_t bytes = rows * cols * int64_t(sizeof(T));
  const L2Hint hint = pick_load_hint(bytes, bytes);
  return pick_forward_tile<T>(
      cols + sm::shift_pad<T>(aligned),  // a tile that holds the shifted row's vectors
      [&](auto elems) {
        by_path(whole, hint, [&](auto w, auto h) {
          softmax_warp_row<T, decltype(elems)::value, decltype(w)::value, decltype(h)::value>
              <<<row_grid(rows, kWarpRowThreads / 32), kWarpRowThreads, 0, stream>>>(x, x_stride, out, rows, cols);
        });
      },
      [&](auto threads, auto elems, auto min_blocks) {
        constexpr int kThreads = decltype(threads)::value;
        by_path(whole, hint, [&](auto w, auto h) {
          for_row_blocks(rows, [&](int64_t first, unsigned blocks) {
            softmax_block_row<T, kThreads, decltype(elems)::value, decltype(min_blocks)::value, decltype(w)::value,
                              decltype(h)::value>
                <<<blocks, kThreads, 0, stream>>>(x + first * x_stride, x_stride, out + first * cols, cols);
          });
        });
      });
}

template <typename T>
bool launch_backward_in_registers(const T* y, int64_t y_stride, const T* dy, int64_t dy_stride, T* dx,
                                  int64_t rows, int64_t cols, cudaStream_t stream) {
  const bool aligned = rows_aligned(y, y_stride) && rows_aligned(dy, dy_stride);
  const bool whole = cols % kVec<T> == 0 && aligned && aligned16(dx);
  const int64_t bytes = rows * cols * int64_t(sizeof(T));
  const L2Hint hint = pick_load_hint(2 * bytes, bytes);
  return pick_backward_tile<T>(
      cols + sm::shift_pad<T>(aligned),
      [&](auto elems) {
        by_path(whole, hint, [&](auto w, auto h) {
          backward_warp_row<T, decltype(elems)::value, decltype(w)::value, decltype(h)::value>
              <<<row_grid(rows, kWarpRowThreads / 32), kWarpRowThreads, 0, stream>>>(y, y_stride, dy, dy_stride, dx,
                                                                                      rows, cols);
        });
      },
      [&](auto threads, auto elems, auto min_blocks) {
        constexpr int kThreads = decltype(threads)::value;
        by_path(whole, hint, [&](auto w, auto h) {
          for_row_blocks(rows, [&](int64_t first, unsigned blocks) {
            backward_block_row<T, kThreads, decltype(elems)::value, decltype(min_blocks)::value, decltype(w)::value,
                               decltype(h)::value>
                <<<blocks, kThreads, 0, stream>>>(y + first * y_stride, y_stride, dy + first * dy_stride, dy_stride,
                                                  dx + first * cols, cols);
          });
        });
      });
}

// ---------------------------------------------------------------------------------------------
// Longer rows, up to what one block's shared memory holds: the row in shared memory.

constexpr int kSmemThreads = 512;
constexpr int kBatch = 8;          // 16-byte vectors in flight per thread (forward)
constexpr int kBatchBackward = 3;  // per tensor: y and dy (4 spills at 64 registers)

// The row in shared memory as the 16-byte vectors of memory it overlaps (shift, load_at: vector i
// holds elements [i V - s, i V - s + V), -inf outside the row; s = 0 on 16 bytes). Thread t
// stores vectors t, t + 512, ... and later reads back exactly those: no barrier is needed
// between the load loop and the write loop, nor before the next row overwrites them.
template <typename T>
__global__ void __launch_bounds__(kSmemThreads, 2)
softmax_row_in_smem(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int cols) {
  constexpr int V = kVec<T>;
  extern __shared__ uint4 row_smem[];  // ceil((cols + s) / V) vectors
  __shared__ sm::Online scratch[kSmemThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // block-uniform: barriers inside
    const T* in = x + row * x_stride;
    T* o = out + row * cols;
    const int s = shift(in);               // the input's own vectors: 16-byte loads but the ends
    const bool vout = shift(o) == s;       // the output's: 16-byte stores where it has the same shift
    const int vecs = (cols + s + V - 1) / V;
    sm::Online t = sm::Online::empty();
    for (int i0 = threadIdx.x; i0 < vecs; i0 += kBatch * kSmemThreads) {
      Vec16<T> v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {  // all loads issue before the first store
        const int i = i0 + b * kSmemThreads;
        if (i < vecs) v[b] = load_at(in, s, i, cols, true, -INFINITY);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (i0 + b * kSmemThreads < vecs) {
          row_smem[i0 + b * kSmemThreads] = v[b].raw;
          t.add(v[b]);
        }
    }
    const sm::Online r = sm::block_merge<kSmemThreads>(t, scratch);
    const float inv = 1.0f / r.d;
    for (int i = threadIdx.x; i < vecs; i += kSmemThreads) {
      Vec16<T> v{row_smem[i]};
#pragma unroll
      for (int k = 0; k < V; ++k) v.set(k, __expf(v.get(k) - r.m) * inv);  // r.m = -inf: NaN, as torch
      store_at(o, s, i, cols, vout, v);
    }
  }
}

// y in the first `slots` vectors of shared memory, dy in the next (slots: what the host gave the
// longest shifted row); both through the row's vectors (sm::backward_shift), the same ownership
// as above.
template <typename T>
__global__ void __launch_bounds__(kSmemThreads, 2)
backward_row_in_smem(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                     T* __restrict__ dx, int64_t rows, int cols, int slots) {
  constexpr int V = kVec<T>;
  extern __shared__ uint4 row_smem[];  // 2 x slots vectors
  __shared__ float scratch[kSmemThreads / 32];
  uint4* const y_smem = row_smem;
  uint4* const dy_smem = row_smem + slots;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* yr = y + row * y_stride;
    const T* gr = dy + row * dy_stride;
    T* o = dx + row * cols;
    const int s = sm::backward_shift(shift(yr), shift(gr), shift(o));
    const bool vy = shift(yr) == s, vg = shift(gr) == s, vo = shift(o) == s;
    const int vecs = (cols + s + V - 1) / V;
    float dot = 0.0f;
    for (int i0 = threadIdx.x; i0 < vecs; i0 += kBatchBackward * kSmemThreads) {
      Vec16<T> a[kBatchBackward], b[kBatchBackward];
#pragma unroll
      for (int u = 0; u < kBatchBackward; ++u) {
        const int i = i0 + u * kSmemThreads;
        if (i < vecs) {
          a[u] = load_at(yr, s, i, cols, vy, 0.0f);  // 0 outside the row: 0 * 0 adds nothing
          b[u] = load_at(gr, s, i, cols, vg, 0.0f);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatchBackward; ++u) {
        const int i = i0 + u * kSmemThreads;
        if (i < vecs) {
          y_smem[i] = a[u].raw;
          dy_smem[i] = b[u].raw;
#pragma unroll
          for (int k = 0; k < V; ++k) dot += a[u].get(k) * b[u].get(k);
        }
      }
    }
    dot = rosetta::block_reduce<kSmemThreads, Sum>(dot, scratch);
    for (int i = threadIdx.x; i < vecs; i += kSmemThreads) {
      const Vec16<T> a{y_smem[i]}, b{dy_smem[i]};
      Vec16<T> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.set(k, a.get(k) * (b.get(k) - dot));
      store_at(o, s, i, cols, vo, r);
    }
  }
}

// 16-byte vectors of shared memory for a row of cols elements (cols + shift_pad: the longest shifted row).
template <typename T>
int64_t smem_slots(int64_t cols) {
  return rosetta::ceil_div(cols, kVec<T>);
}

}  // namespace

cudaError_t softmax_05_row_on_chip(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    T* out = a.out.ptr<T>();
    if (launch_forward_in_registers(x, a.x.stride[0], out, rows, cols, stream)) return;
    const int64_t bytes = smem_slots<T>(cols + sm::shift_pad<T>(rows_aligned(x, a.x.stride[0]))) * 16;
    if (bytes > sm::max_dynamic_smem()) {
      status = cudaErrorInvalidValue;  // too long for one SM: declared (Max: row_bytes), refused before launch
      return;
    }
    status = cudaFuncSetAttribute(softmax_row_in_smem<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (status == cudaSuccess)
      softmax_row_in_smem<T><<<row_grid(rows), kSmemThreads, bytes, stream>>>(x, a.x.stride[0], out, rows, int(cols));
  });
  return status != cudaSuccess ? status : launched;
}

cudaError_t softmax_05_row_on_chip_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* y = a.y.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    T* dx = a.dx.ptr<T>();
    const int64_t ys = a.y.stride[0], gs = a.dy.stride[0];
    if (launch_backward_in_registers(y, ys, dy, gs, dx, rows, cols, stream)) return;
    const int64_t slots = smem_slots<T>(cols + sm::shift_pad<T>(rows_aligned(y, ys) && rows_aligned(dy, gs)));
    const int64_t bytes = 2 * slots * 16;
    if (bytes > sm::max_dynamic_smem()) {
      status = cudaErrorInvalidValue;  // y and dy too long for one SM: declared, refused before launch
      return;
    }
    status = cudaFuncSetAttribute(backward_row_in_smem<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (status == cudaSuccess)
      backward_row_in_smem<T><<<row_grid(rows), kSmemThreads, bytes, stream>>>(y, ys, dy, gs, dx, rows, int(cols),
                                                                                int(slots));
  });
  return status != cudaSuccess ? status : launched;
}
