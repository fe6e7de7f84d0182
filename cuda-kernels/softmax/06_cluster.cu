/*
Step 6 — a long row over a thread-block cluster, partials through distributed shared memory
Changed:  a row longer than step 5's register tiles (> 16,384 elements) is cut into C equal
          slices (C = 1, 2, 4, 8 or 16), one per CTA of a cluster (sm_90: up to 8 portable,
          16 with cudaFuncAttributeNonPortableClusterSizeAllowed). Each 512-thread CTA loads
          its slice once into shared memory (8 16-byte vectors in flight per thread) and folds
          it into an online (max, sum) pair; thread 0 publishes the CTA's pair in shared memory;
          cluster.sync() (barrier.cluster); every warp then reads the C pairs straight from
          the peers' shared memory (cluster.map_shared_rank: MAPA + LD over DSMEM) and merges
          them; each CTA writes its slice from shared memory. Backward: y and dy slices in
          shared memory, the partial dots sum(y * dy) exchanged the same way. C is the
          smallest that gives <= 100 KB of slice per CTA (two CTAs per SM, so one's exchange
          overlaps the other's loads), else <= ~226 KB (one per SM); launched with
          cudaLaunchKernelEx and cudaLaunchAttributeClusterDimension. The step is meant for
          the rows step 5's register tiles do not hold (`Min: cols >= 16385`): shorter rows are
          the dispatcher's to give to step 5. A row off 16 bytes is cut at the 16-byte vectors
          of memory it overlaps, as in step 5: 16-byte loads and stores but in its first and
          last vector (8x fewer instructions than element by element for 16-bit types).
Why:      step 5 read rows past one SM's 227 KB twice (bf16 4096 x 131072 is 256 KB a row,
          fp32 4096 x 262144 1 MB): 3n bytes, <= 2/3 of the copy ceiling. A cluster's shared
          memory is up to 16 x 227 KB: 1 MB of fp32 is 16 x 64 KB (or 8 x 128 KB), so the row
          costs 1 read + 1 write again (2n; backward 2 MB of y and dy: 16 x 128 KB, 3n). The
          exchange is C pairs of 8 bytes per row over DSMEM and two cluster barriers, against
          8-16 us of DRAM time per 1 MB row per cluster. One-wave arithmetic: 4,096 rows, a
          cluster of 16 per row, 2 CTAs per SM: ~16 rows in flight, 256 rounds, so the tail
          is < 1%. Bytes in flight: 512 threads x 128 B = 64 KB per CTA.
Still:    each CTA's load, exchange and write are phases; two CTAs per SM hide the barrier
          latency only where the slice is <= 100 KB (the fp32 262,144 backward runs one CTA
          per SM). Rows past 16 x ~226 KB (fp32 > ~900K elements, backward ~450K) do not fit.
Limits:   rows of 16,384 elements or fewer (step 5's) and rows past what a cluster of 16 holds
          (`Max: row_bytes`, ~3.7 MB of x, or of y and dy) are refused before launch; step 4
          takes any row.
Layout:   rows
Min:      cols >= 16385
Max:      row_bytes <= 3700000
*/
#include <cooperative_groups.h>

#include "softmax.cuh"

namespace {

namespace cg = cooperative_groups;
namespace sm = rosetta::softmax;
using rosetta::Vec16;

constexpr int kThreads = 512;
constexpr int kBatch = 8;                 // 16-byte vectors in flight per thread (forward)
constexpr int kBatchBackward = 3;         // per tensor (y and dy): what 64 registers hold
constexpr int64_t kShareBytes = 100 << 10;  // a slice this small leaves room for 2 CTAs per SM
constexpr int kMaxCluster = 16;

// A row is read as the 16-byte vectors of memory it overlaps (sm::load_at: vector j holds elements
// [j V - s, j V - s + V), s = 0 for a row on 16 bytes); CTA `rank` of the cluster owns vectors
// [rank * slice / V, (rank + 1) * slice / V) of every row it visits (slice: a multiple of the
// vector width; the host sizes it for cols + s). Thread t stores vectors t, t + 512, ... of the
// slice in shared memory and later reads back only those: no CTA barrier between loading and
// writing, nor before the next row.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
softmax_cluster(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int cols, int slice) {
  constexpr int V = sm::kVec<T>;
  extern __shared__ uint4 slice_smem[];  // slice / V vectors
  __shared__ sm::Online scratch[kThreads / 32];
  __shared__ sm::Online partial;  // this CTA's (max, sum), read by every CTA of the cluster
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  const int lane = threadIdx.x % 32;
  const int first = rank * (slice / V);  // this CTA's first vector of a row
  const int64_t clusters = gridDim.x / ranks;
  for (int64_t row = blockIdx.x / ranks; row < rows; row += clusters) {  // cluster-uniform: barriers inside
    const T* in = x + row * x_stride;
    T* o = out + row * cols;
    const int s = sm::shift(in);          // the input's own vectors: 16-byte loads but the row's ends
    const bool vout = sm::shift(o) == s;  // the output's: 16-byte stores where it has the same shift
    const int vecs = max(0, min(slice / V, (cols + s + V - 1) / V - first));  // 0 past a short row's end
    sm::Online t = sm::Online::empty();
    for (int i0 = threadIdx.x; i0 < vecs; i0 += kBatch * kThreads) {
      Vec16<T> v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)  // all loads issue before the first store
        if (i0 + b * kThreads < vecs) v[b] = sm::load_at(in, s, first + i0 + b * kThreads, cols, true, -INFINITY);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (i0 + b * kThreads < vecs) {
          slice_smem[i0 + b * kThreads] = v[b].raw;
          t.add(v[b]);
        }
    }
    t = sm::block_merge<kThreads>(t, scratch);
    if (threadIdx.x == 0) partial = t;
    // Every CTA's pair is written (arrive: release) and visible to all (wait: acquire). The
    // first sync also guarantees that every peer has started, before its shared memory is read.
    cluster.sync();
    // Lane r of every warp reads CTA r's pair over DSMEM; the butterfly merge gives every
    // warp of every CTA the same bits, so all slices are scaled alike.
    const sm::Online r = sm::warp_merge(lane < ranks ? *cluster.map_shared_rank(&partial, lane) : sm::Online::empty());
    // Done reading the peers. The matching wait comes after the writes: no CTA may rewrite its
    // `partial` (next row) or exit while a peer may still be reading it.
    cluster.barrier_arrive();
    const float inv = 1.0f / r.d;
    for (int i = threadIdx.x; i < vecs; i += kThreads) {
      Vec16<T> v{slice_smem[i]};
#pragma unroll
      for (int k = 0; k < V; ++k) v.set(k, __expf(v.get(k) - r.m) * inv);  // r.m = -inf: NaN, as torch
      sm::store_at(o, s, first + i, cols, vout, v);
    }
    cluster.barrier_wait();
  }
}

// y in vectors [0, slice / V) of shared memory, dy in [slice / V, 2 slice / V).
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
backward_cluster(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                 T* __restrict__ dx, int64_t rows, int cols, int slice) {
  constexpr int V = sm::kVec<T>;
  extern __shared__ uint4 slice_smem[];
  __shared__ float scratch[kThreads / 32];
  __shared__ float partial;  // this CTA's sum(y * dy)
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  const int lane = threadIdx.x % 32;
  const int first = rank * (slice / V);
  uint4* const y_smem = slice_smem;
  uint4* const dy_smem = slice_smem + slice / V;
  const int64_t clusters = gridDim.x / ranks;
  for (int64_t row = blockIdx.x / ranks; row < rows; row += clusters) {
    const T* yr = y + row * y_stride;
    const T* gr = dy + row * dy_stride;
    T* o = dx + row * cols;
    const int s = sm::backward_shift(sm::shift(yr), sm::shift(gr), sm::shift(o));
    const bool vy = sm::shift(yr) == s, vg = sm::shift(gr) == s, vo = sm::shift(o) == s;
    const int vecs = max(0, min(slice / V, (cols + s + V - 1) / V - first));
    float dot = 0.0f;
    for (int i0 = threadIdx.x; i0 < vecs; i0 += kBatchBackward * kThreads) {
      Vec16<T> a[kBatchBackward], b[kBatchBackward];
#pragma unroll
      for (int u = 0; u < kBatchBackward; ++u) {
        const int i = i0 + u * kThreads;
        if (i < vecs) {
          a[u] = sm::load_at(yr, s, first + i, cols, vy, 0.0f);  // 0 outside the row: 0 * 0 adds nothing
          b[u] = sm::load_at(gr, s, first + i, cols, vg, 0.0f);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatchBackward; ++u) {
        const int i = i0 + u * kThreads;
        if (i < vecs) {
          y_smem[i] = a[u].raw;
          dy_smem[i] = b[u].raw;
#pragma unroll
          for (int k = 0; k < V; ++k) dot += a[u].get(k) * b[u].get(k);
        }
      }
    }
    dot = rosetta::block_reduce<kThreads, rosetta::Sum>(dot, scratch);
    if (threadIdx.x == 0) partial = dot;
    cluster.sync();  // as in the forward: every partial written and visible, every peer running
    // Lane r reads CTA r's dot; a butterfly sum of the same 16 values: the same bits everywhere.
    dot = rosetta::warp_sum(lane < ranks ? *cluster.map_shared_rank(&partial, lane) : 0.0f);
    cluster.barrier_arrive();
    for (int i = threadIdx.x; i < vecs; i += kThreads) {
      const Vec16<T> a{y_smem[i]}, b{dy_smem[i]};
      Vec16<T> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.set(k, a.get(k) * (b.get(k) - dot));
      sm::store_at(o, s, first + i, cols, vo, r);
    }
    cluster.barrier_wait();
  }
}

// Launches kernel(args..., rows, cols, slice) with the smallest cluster whose slices fit
// (tensors: slices of shared memory per element, 1 forward, 2 backward; the slices cover cols +
// pad elements, sm::shift_pad: room for a row off 16 bytes). Fitting: <= 100 KB a
// CTA first (two CTAs per SM), then anything the opt-in allows; the hardware must also be able
// to place such a cluster (cudaOccupancyMaxActiveClusters > 0: size 16 needs a GPC with 8+ free
// SMs). Returns false, having launched nothing, when no cluster holds the row.
template <typename T, typename Kernel, typename... Args>
bool launch_cluster(Kernel kernel, int tensors, int64_t rows, int64_t cols, int64_t pad, cudaStream_t stream,
                    cudaError_t& status, Args... args) {
  constexpr int V = sm::kVec<T>;
  for (const int64_t budget : {kShareBytes, sm::max_dynamic_smem()}) {
    for (int ranks = 1; ranks <= kMaxCluster; ranks *= 2) {
      const int64_t slice = rosetta::ceil_div(rosetta::ceil_div(cols + pad, ranks), V) * V;
      const int64_t bytes = tensors * slice * int64_t(sizeof(T));
      if (bytes > budget) continue;
      const bool settable =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess &&
          (ranks <= 8 || cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess);
      if (!settable) {
        (void)cudaGetLastError();  // not on this device: try the next size
        continue;
      }
      cudaLaunchAttribute cluster_dim{};
      cluster_dim.id = cudaLaunchAttributeClusterDimension;
      cluster_dim.val.clusterDim.x = unsigned(ranks);
      cluster_dim.val.clusterDim.y = 1;
      cluster_dim.val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(ranks * std::min<int64_t>(rows, INT32_MAX / ranks)));  // a cluster per row
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = size_t(bytes);
      config.stream = stream;
      config.attrs = &cluster_dim;
      config.numAttrs = 1;
      int placeable = 0;
      if (cudaOccupancyMaxActiveClusters(&placeable, kernel, &config) != cudaSuccess || placeable == 0) {
        (void)cudaGetLastError();  // a cluster this device cannot place: try the next size
        continue;
      }
      status = cudaLaunchKernelEx(&config, kernel, args..., rows, int(cols), int(slice));
      return true;
    }
  }
  return false;
}

}  // namespace

cudaError_t softmax_06_cluster(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  return sm::launch_forward(a, stream, [&](auto tag, auto x, int64_t xs, auto out) {
    using T = decltype(tag);
    cudaError_t status = cudaSuccess;
    const int64_t pad = sm::shift_pad<T>(sm::rows_aligned(x, xs));
    if (!launch_cluster<T>(softmax_cluster<T>, 1, rows, cols, pad, stream, status, x, xs, out))
      return cudaErrorInvalidValue;  // a row this step does not take: declared in its header, refused before launch
    return status;
  });
}

cudaError_t softmax_06_cluster_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  return sm::launch_backward(a, stream, [&](auto tag, auto y, int64_t ys, auto dy, int64_t gs, auto dx) {
    using T = decltype(tag);
    cudaError_t status = cudaSuccess;
    const int64_t pad = sm::shift_pad<T>(sm::rows_aligned(y, ys) && sm::rows_aligned(dy, gs));
    if (!launch_cluster<T>(backward_cluster<T>, 2, rows, cols, pad, stream, status, y, ys, dy, gs, dx))
      return cudaErrorInvalidValue;  // declared in the header, refused before launch
    return status;
  });
}
