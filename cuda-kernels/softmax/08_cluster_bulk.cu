/*
Step 8 — the cluster's slices in shared memory again, filled by the copy engine, in small CTAs
Changed:  step 7's slices move back into shared memory, but no thread loads them: thread 0 of
          each CTA issues one bulk copy per tensor (cp.async.bulk global -> shared, the 1-D
          form of TMA) that completes a transaction on an mbarrier, and every thread waits on
          that barrier. CTAs shrink to 256 threads and slices to 32 KB a tensor (a cluster of
          up to 16 per row; past 16 x 32 KB the slices grow, up to what an SM holds), so six
          forward CTAs share an SM. Each thread then takes its vectors of the slice from shared
          memory three times (max, sum of exp, write; backward: dot, write), merges across the
          cluster with step 7's one st.async message per warp, and writes its part of the row
          with 16-byte stores.
Why:      step 7's 16-bit forward keeps 64 KB per SM in flight: two CTAs of 512 threads that
          hold 32 packed elements each, and whenever both are between their loads and their
          stores (reducing, exchanging, writing) the SM asks DRAM for nothing. Registers cap
          what a thread can have in flight; the copy engine needs no registers at all, so the
          bytes in flight are bounded by shared memory instead: 6 x 32 KB = 192 KB per SM for
          bf16 rows of 131,072 (8 CTAs a row), 3 x 64 KB for fp32 rows of 262,144 (16 a row).
          Shared-memory reads are cheap next to DRAM: three 32 KB passes take ~1.5 us of an
          SM's 128 B/clk, against ~11 us to bring 32 KB x 6 CTAs from DRAM at 1/132 of 3 TB/s.
Still:    a CTA's copy lands whole before any thread starts, then three passes over shared
          memory and the exchange leave its SM's DRAM traffic to the other CTAs: fp32 rows of
          262,144 run slower here than in step 7's registers (512 threads a CTA hide it better),
          and so do both backwards, which need y's and dy's slices (bf16 rows of 131,072: 3 CTAs
          of 64 KB per SM; fp32 rows of 262,144: one CTA of 128 KB, idle between its phases).
          Each CTA lives for one row; a persistent CTA copying the next row measured slower.
Limits:   refused before launch: rows of 16,384 elements or fewer (step 5's), rows that are
          not whole 16-byte vectors from 16-byte-aligned starts (`unaligned_rows`), rows that
          need more than 16 CTAs of ~225 KB (`Max: row_bytes`, ~3.68 MB of x, or of y and dy).
          Step 4 takes any row, step 6 long unaligned ones.
Layout:   rows
Min:      cols >= 16385
Max:      unaligned_rows <= 0; row_bytes <= 3680000
*/
#include <cooperative_groups.h>

#include "softmax_cluster.cuh"

namespace {

namespace cg = cooperative_groups;
namespace sm = rosetta::softmax;
namespace sm90 = rosetta::sm90;
using rosetta::Vec16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kSliceBytes = 32 << 10;  // per tensor: 6 forward CTAs of 16-bit rows per SM

// This CTA's part of the row: CTA `rank` owns elements [rank * slice, ...) up to the row's end.
struct SliceOf {
  int64_t row;
  int begin, vecs;  // first element, 16-byte vectors
};
template <typename T>
__device__ __forceinline__ SliceOf slice_of(int rank, int ranks, int cols, int slice) {
  const int begin = rank * slice;
  return {blockIdx.x / ranks, begin, min(slice, cols - begin) / sm::kVec<T>};
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
softmax_cluster_bulk(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int cols, int slice) {
  constexpr int V = sm::kVec<T>;
  extern __shared__ uint4 xs[];  // the slice of x, as in global memory
  __shared__ alignas(16) sm::Online inbox[sm::kMaxCluster * kWarps];
  __shared__ alignas(8) uint64_t loaded, received;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  const SliceOf s = slice_of<T>(rank, ranks, cols, slice);
  if (threadIdx.x == 0) sm90::mbarrier_init(&loaded, 1);
  sm::open_inbox<kWarps, sm::Online>(&received, ranks);  // its fence also publishes `loaded`
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&loaded, uint32_t(s.vecs) * 16);
    sm90::bulk_load(xs, x + s.row * x_stride + s.begin, uint32_t(s.vecs) * 16, &loaded);
  }
  __syncthreads();  // nobody waits on `loaded` before it is initialised
  sm90::mbarrier_wait(&loaded, 0);
  float m = -INFINITY;
#pragma unroll 4
  for (int i = threadIdx.x; i < s.vecs; i += kThreads) {
    const Vec16<T> v{xs[i]};
#pragma unroll
    for (int k = 0; k < V; ++k) m = fmaxf(m, v.get(k));  // fmaxf skips NaN: the sum catches it
  }
  const float ref = sm::reference(m);
  float d = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < s.vecs; i += kThreads) {
    const Vec16<T> v{xs[i]};
#pragma unroll
    for (int k = 0; k < V; ++k) d += __expf(v.get(k) - ref);
  }
  sm::exchange<kWarps>(inbox, &received, rank, ranks, sm::warp_merge(sm::Online{m, d}));
  const sm::Online r = sm::inbox_total(inbox, ranks * kWarps);  // the same bits in every CTA
  const float inv = 1.0f / r.d;
  uint4* o = reinterpret_cast<uint4*>(out + s.row * cols + s.begin);
#pragma unroll 4
  for (int i = threadIdx.x; i < s.vecs; i += kThreads) {
    const Vec16<T> v{xs[i]};
    Vec16<T> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.set(k, __expf(v.get(k) - r.m) * inv);  // r.m = -inf: NaN, as torch
    o[i] = y.raw;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
backward_cluster_bulk(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                      T* __restrict__ dx, int cols, int slice) {
  constexpr int V = sm::kVec<T>;
  extern __shared__ uint4 ys[];  // the slice of y (slice / V vectors), then dy's
  __shared__ alignas(16) float inbox[sm::kMaxCluster * kWarps];
  __shared__ alignas(8) uint64_t loaded, received;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  const SliceOf s = slice_of<T>(rank, ranks, cols, slice);
  uint4* gs = ys + slice / V;
  if (threadIdx.x == 0) sm90::mbarrier_init(&loaded, 1);
  sm::open_inbox<kWarps, float>(&received, ranks);
  if (threadIdx.x == 0) {
    const uint32_t bytes = uint32_t(s.vecs) * 16;
    sm90::mbarrier_arrive_expect_tx(&loaded, 2 * bytes);
    sm90::bulk_load(ys, y + s.row * y_stride + s.begin, bytes, &loaded);
    sm90::bulk_load(gs, dy + s.row * dy_stride + s.begin, bytes, &loaded);
  }
  __syncthreads();
  sm90::mbarrier_wait(&loaded, 0);
  float dot = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < s.vecs; i += kThreads) {
    const Vec16<T> a{ys[i]}, b{gs[i]};
#pragma unroll
    for (int k = 0; k < V; ++k) dot += a.get(k) * b.get(k);
  }
  sm::exchange<kWarps>(inbox, &received, rank, ranks, rosetta::warp_sum(dot));
  const float total = sm::inbox_total(inbox, ranks * kWarps);
  uint4* o = reinterpret_cast<uint4*>(dx + s.row * cols + s.begin);
#pragma unroll 4
  for (int i = threadIdx.x; i < s.vecs; i += kThreads) {
    const Vec16<T> a{ys[i]}, b{gs[i]};
    Vec16<T> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.set(k, a.get(k) * (b.get(k) - total));
    o[i] = r.raw;
  }
}

// Enough CTAs per row that a slice is at most kSliceBytes a tensor, at most 16 of them; past
// 16 x kSliceBytes the slices grow. The last slice may be shorter (the copy takes its length).
// False when a CTA's `tensors` slices outgrow its shared memory or the rows are not whole 16-byte
// vectors from 16-byte-aligned starts (`aligned`).
template <typename T>
bool plan_clusters(int64_t cols, int tensors, bool aligned, int& ranks, int& slice) {
  constexpr int V = sm::kVec<T>;
  const int64_t r = std::min<int64_t>(rosetta::ceil_div(cols * int64_t(sizeof(T)), kSliceBytes), sm::kMaxCluster);
  const int64_t s = rosetta::ceil_div(rosetta::ceil_div(cols, r), V) * V;
  constexpr int64_t kStatic = 2048;  // room for the inbox (at most 1 KB) and the barriers
  if (!aligned || cols % V != 0 || tensors * s * int64_t(sizeof(T)) > sm::max_dynamic_smem() - kStatic) return false;
  ranks = int(rosetta::ceil_div(cols, s));  // no CTA without elements
  slice = int(s);
  return true;
}

}  // namespace

cudaError_t softmax_08_cluster_bulk(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  return sm::launch_forward(a, stream, [&](auto tag, auto x, int64_t xs, auto out) {
    using T = decltype(tag);
    int ranks = 0, slice = 0;
    if (!plan_clusters<T>(cols, 1, sm::rows_aligned(x, xs) && sm::rows_aligned(out, cols), ranks, slice)) {
      return cudaErrorInvalidValue;  // a row this step does not take: declared in its header, refused before launch
    }
    const auto kernel = softmax_cluster_bulk<T>;
    const size_t smem = size_t(slice) * sizeof(T);
    return sm::launch_cluster_rows(kernel, rows, ranks, kThreads, smem, stream, [&](cudaLaunchConfig_t& c, int64_t first) {
      return cudaLaunchKernelEx(&c, kernel, x + first * xs, xs, out + first * cols, int(cols), slice);
    });
  });
}

cudaError_t softmax_08_cluster_bulk_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  return sm::launch_backward(a, stream, [&](auto tag, auto y, int64_t ys, auto dy, int64_t gs, auto dx) {
    using T = decltype(tag);
    int ranks = 0, slice = 0;
    const bool aligned = sm::rows_aligned(y, ys) && sm::rows_aligned(dy, gs) && sm::rows_aligned(dx, cols);
    if (!plan_clusters<T>(cols, 2, aligned, ranks, slice)) {
      return cudaErrorInvalidValue;  // declared in the header, refused before launch
    }
    const auto kernel = backward_cluster_bulk<T>;
    const size_t smem = 2 * size_t(slice) * sizeof(T);
    return sm::launch_cluster_rows(kernel, rows, ranks, kThreads, smem, stream, [&](cudaLaunchConfig_t& c, int64_t first) {
      return cudaLaunchKernelEx(&c, kernel, y + first * ys, ys, dy + first * gs, gs, dx + first * cols, int(cols),
                                slice);
    });
  });
}
