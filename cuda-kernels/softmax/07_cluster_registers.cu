/*
Step 7 — the cluster's row in registers, partials exchanged with one st.async round trip
Changed:  step 6's slices move from shared memory into registers, and its exchange shrinks to
          one message per warp. Each thread of a 512-thread CTA loads 32 elements of its CTA's
          slice per tensor (8 16-byte vectors of fp32, 4 of 16-bit types) and keeps them as
          loaded (16-bit values stay packed, 2 to a register), so a CTA holds 64 KB of fp32 or
          32 KB of 16-bit values per tensor and a cluster of up to 16 holds rows of 262,144.
          The forward takes the max of its values, then the sum of exp against it (two passes
          over registers, as step 5), the backward its partial dot; each warp merges its lanes
          and lane r stores the warp's partial straight into CTA r's inbox with st.async, which
          completes a transaction on CTA r's mbarrier; every CTA waits on its own barrier for
          ranks x 16 messages, merges them in a fixed order (the same bits everywhere) and
          writes its slice from registers. One row per cluster. The cluster barrier that orders
          each mbarrier's initialisation before any peer's st.async is arrived at before the
          loads and waited on after them.
Why:      step 6 spends each row on phases that move no data: two CTA barriers for the block
          merge, a full cluster barrier over up to 16 SMs, a round trip of remote loads, a
          second cluster barrier before exit, and a pass over shared memory on each side of
          the exchange. Here the one wait is the mbarrier the peers' messages complete, and the
          row is written from the registers it was read into. Bytes in flight decide the rest:
          a CTA does nothing but wait between its loads and its stores, so an SM needs two
          CTAs, one loading while the other writes. Registers: forward 64 or fewer (two CTAs per
          SM: 128 KB of fp32 or 64 KB of 16-bit values in flight); backward 91 fp32 (one CTA,
          128 KB of y and dy), 63-64 for 16-bit (two CTAs). 16-bit slices hold half the elements
          of fp32 ones because 8 packed vectors need more than 64 registers once converted
          (they spill), and one CTA per SM idles between its phases.
Still:    only slices of whole, 16-byte-aligned vectors run here (an element-wise tail path
          spills at 64 registers), rows up to 16 x 512 x 32 elements; step 6's shared memory
          reaches 16 x 226 KB. A CTA lives for one row: 4,096 rows of 16 slices start 65,536
          CTAs. 16-bit forward rows keep only 64 KB in flight per SM.
Limits:   refused before launch: rows of 16,384 elements or fewer (step 5's), rows that are not
          whole 16-byte vectors from 16-byte-aligned starts (`unaligned_rows`), rows that do
          not cut into equal slices of whole vectors of at most 16,384 elements, 16 at most
          (`uneven_register_slices`: fp32 16,388 or 262,151, bf16 50,000). Step 4 takes any
          row, step 6 these long ones.
Layout:   rows
Min:      cols >= 16385
Max:      unaligned_rows <= 0; uneven_register_slices <= 0
*/
#include <cooperative_groups.h>

#include "softmax_cluster.cuh"

namespace {

namespace cg = cooperative_groups;
namespace sm = rosetta::softmax;
using rosetta::Vec16;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kElems = 32;        // elements per thread and tensor

template <typename T> constexpr int kVecs = kElems / sm::kVec<T>;  // 16-byte vectors: 8 fp32, 4 16-bit
constexpr int kSliceMax = kThreads * kElems;  // elements a CTA holds

// A CTA's slice of a row in registers, as loaded: thread t holds vectors t, t + 512, ... of the
// slice (coalesced), `fill` past its `len` elements. The slice is whole 16-byte vectors from
// an aligned start (the host checks), so each vector is simply in or out: no element-wise tail
// path, whose registers would spill at 64 a thread.
template <typename T>
struct Slice {
  static constexpr int kCount = kVecs<T>;
  Vec16<T> v[kCount];

  __device__ __forceinline__ int col(int i) const { return (i * kThreads + int(threadIdx.x)) * sm::kVec<T>; }
  __device__ __forceinline__ void load(const T* row, int len, float fill) {
    Vec16<T> pad;
#pragma unroll
    for (int k = 0; k < sm::kVec<T>; ++k) pad.set(k, fill);
#pragma unroll
    for (int i = 0; i < kCount; ++i)  // all loads issue before the first use
      v[i].raw = col(i) < len ? *reinterpret_cast<const uint4*>(row + col(i)) : pad.raw;
  }
  // Vector i's packed registers, passed through an empty asm: the compiler must convert them again
  // instead of keeping an earlier pass's fp32 copies alive (twice the registers for 16-bit types).
  __device__ __forceinline__ const Vec16<T>& reload(int i) {
    asm volatile("" : "+r"(v[i].raw.x), "+r"(v[i].raw.y), "+r"(v[i].raw.z), "+r"(v[i].raw.w));
    return v[i];
  }
  __device__ __forceinline__ void store(T* row, int len) const {
#pragma unroll
    for (int i = 0; i < kCount; ++i)
      if (col(i) < len) *reinterpret_cast<uint4*>(row + col(i)) = v[i].raw;
  }
};

// Two CTAs per SM: at most 64 registers.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
softmax_cluster_registers(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int cols, int slice) {
  constexpr int V = sm::kVec<T>;
  __shared__ alignas(16) sm::Online inbox[sm::kMaxCluster * kWarps];
  __shared__ alignas(8) uint64_t full;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  sm::open_inbox<kWarps, sm::Online>(&full, ranks);
  const int64_t row = blockIdx.x / ranks;  // one row per cluster; the host offsets x and out
  const int begin = rank * slice;  // cols == ranks * slice: every slice is full (the host checks)
  Slice<T> s;
  s.load(x + row * x_stride + begin, slice, -INFINITY);  // -inf: adds nothing to the max or sum
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < s.kCount; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) m = fmaxf(m, s.v[i].get(k));  // fmaxf skips NaN: the sum catches it
  const float ref = sm::reference(m);
  float d = 0.0f;
#pragma unroll
  for (int i = 0; i < s.kCount; ++i) {
    const Vec16<T> in = s.reload(i);
#pragma unroll
    for (int k = 0; k < V; ++k) d += __expf(in.get(k) - ref);
  }
  sm::exchange<kWarps>(inbox, &full, rank, ranks, sm::warp_merge(sm::Online{m, d}));
  const sm::Online r = sm::inbox_total(inbox, ranks * kWarps);  // the same bits in every CTA
  const float inv = 1.0f / r.d;
#pragma unroll
  for (int i = 0; i < s.kCount; ++i) {
    const Vec16<T> in = s.reload(i);
#pragma unroll
    for (int k = 0; k < V; ++k) s.v[i].set(k, __expf(in.get(k) - r.m) * inv);  // r.m = -inf: NaN, as torch
  }
  s.store(out + row * cols + begin, slice);
}

// fp32: 64 values of y and dy need ~91 registers, one CTA per SM; 16-bit: 63-64, two.
template <typename T>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 4 ? 1 : 2)
backward_cluster_registers(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                           T* __restrict__ dx, int cols, int slice) {
  constexpr int V = sm::kVec<T>;
  __shared__ alignas(16) float inbox[sm::kMaxCluster * kWarps];
  __shared__ alignas(8) uint64_t full;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  sm::open_inbox<kWarps, float>(&full, ranks);
  const int64_t row = blockIdx.x / ranks;
  const int begin = rank * slice;
  Slice<T> sy, sg;
  sy.load(y + row * y_stride + begin, slice, 0.0f);  // 0 past the end: 0 * 0 adds nothing
  sg.load(dy + row * dy_stride + begin, slice, 0.0f);
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < sy.kCount; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) dot += sy.v[i].get(k) * sg.v[i].get(k);
  sm::exchange<kWarps>(inbox, &full, rank, ranks, rosetta::warp_sum(dot));
  const float total = sm::inbox_total(inbox, ranks * kWarps);
#pragma unroll
  for (int i = 0; i < sy.kCount; ++i) {
    const Vec16<T> a = sy.reload(i), b = sg.reload(i);
#pragma unroll
    for (int k = 0; k < V; ++k) sg.v[i].set(k, a.get(k) * (b.get(k) - total));
  }
  sg.store(dx + row * cols + begin, slice);
}

// A cluster of ceil(cols / (512 x 32)) CTAs per row, slices balanced to whole vectors. False when
// the row needs more than 16 CTAs or its slices are not whole 16-byte vectors from `aligned`
// starts (every row of every tensor on 16 B).
template <typename T>
bool plan_clusters(int64_t cols, bool aligned, int& ranks, int& slice) {
  constexpr int V = sm::kVec<T>;
  const int64_t r = rosetta::ceil_div(cols, kSliceMax);
  const int64_t s = rosetta::ceil_div(rosetta::ceil_div(cols, r), V) * V;
  if (r > sm::kMaxCluster || !aligned || cols != r * s) return false;
  ranks = int(r);
  slice = int(s);
  return true;
}

}  // namespace

cudaError_t softmax_07_cluster_registers(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  return sm::launch_forward(a, stream, [&](auto tag, auto x, int64_t xs, auto out) {
    using T = decltype(tag);
    int ranks = 0, slice = 0;
    if (!plan_clusters<T>(cols, sm::rows_aligned(x, xs) && sm::rows_aligned(out, cols), ranks, slice)) {
      return cudaErrorInvalidValue;  // a row this step does not take: declared in its header, refused before launch
    }
    const auto kernel = softmax_cluster_registers<T>;
    return sm::launch_cluster_rows(kernel, rows, ranks, kThreads, 0, stream, [&](cudaLaunchConfig_t& c, int64_t first) {
      return cudaLaunchKernelEx(&c, kernel, x + first * xs, xs, out + first * cols, int(cols), slice);
    });
  });
}

cudaError_t softmax_07_cluster_registers_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  return sm::launch_backward(a, stream, [&](auto tag, auto y, int64_t ys, auto dy, int64_t gs, auto dx) {
    using T = decltype(tag);
    int ranks = 0, slice = 0;
    const bool aligned = sm::rows_aligned(y, ys) && sm::rows_aligned(dy, gs) && sm::rows_aligned(dx, cols);
    if (!plan_clusters<T>(cols, aligned, ranks, slice)) {
      return cudaErrorInvalidValue;  // declared in the header, refused before launch
    }
    const auto kernel = backward_cluster_registers<T>;
    return sm::launch_cluster_rows(kernel, rows, ranks, kThreads, 0, stream, [&](cudaLaunchConfig_t& c, int64_t first) {
      return cudaLaunchKernelEx(&c, kernel, y + first * ys, ys, dy + first * gs, gs, dx + first * cols, int(cols),
                                slice);
    });
  });
}
