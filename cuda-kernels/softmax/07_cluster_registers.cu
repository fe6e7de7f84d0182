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
          spills at 64 registers); other rows (odd lengths, unaligned strides) and rows past
          16 x 512 x 32 elements take step 4's online kernels (2 reads + 1 write), where step
          6's shared memory reaches 16 x 226 KB. A CTA lives for one row: 4,096 rows of 16
          slices start 65,536 CTAs. 16-bit forward rows keep only 64 KB in flight per SM.
Limits:   none: rows that do not fit as above take step 4's kernels.
Layout:   rows
*/
#include <cooperative_groups.h>

#include "hopper.cuh"
#include "softmax.cuh"

namespace {

namespace cg = cooperative_groups;
namespace sm = rosetta::softmax;
namespace sm90 = rosetta::sm90;
using rosetta::Vec16;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kElems = 32;        // elements per thread and tensor
constexpr int kMaxCluster = 16;   // with cudaFuncAttributeNonPortableClusterSizeAllowed

template <typename T> constexpr int kVecs = kElems / sm::kVec<T>;  // 16-byte vectors: 8 fp32, 4 16-bit
template <typename T> constexpr int kSliceMax = kThreads * kElems;  // elements a CTA holds

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

// The exchange. mapa turns a shared-memory address into the same offset in CTA `rank`'s shared
// memory; st.async writes there and completes `bytes` of a transaction on that CTA's barrier.
__device__ __forceinline__ uint32_t peer_address(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(sm90::smem_u32(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ void send(const sm::Online* slot, uint64_t* bar, int rank, sm::Online p) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
               ::"r"(peer_address(slot, rank)), "f"(p.m), "f"(p.d), "r"(peer_address(bar, rank)) : "memory");
}
__device__ __forceinline__ void send(const float* slot, uint64_t* bar, int rank, float p) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];\n"
               ::"r"(peer_address(slot, rank)), "f"(p), "r"(peer_address(bar, rank)) : "memory");
}

// The barrier expects ranks x kWarps messages of type P; then every thread of every CTA arrives on
// the cluster barrier (relaxed: the fence publishes the initialisation). The matching wait,
// before the first send, is the caller's: it overlaps the loads.
template <typename P>
__device__ __forceinline__ void open_inbox(uint64_t* bar, int ranks) {
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(bar, 1);
    sm90::mbarrier_arrive_expect_tx(bar, uint32_t(ranks * kWarps * sizeof(P)));  // 0 arrivals left
    sm90::fence_barrier_init();
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

// Lane r of every warp sends the warp's partial to CTA r, into slot [this rank][warp]; the
// phase completes when every peer's messages have landed, and nothing writes the inbox again.
template <typename P>
__device__ __forceinline__ void exchange(P* inbox, uint64_t* bar, int rank, int ranks, P partial) {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // every peer's barrier is ready
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane < ranks) send(&inbox[rank * kWarps + warp], bar, lane, partial);
  sm90::mbarrier_wait(bar, 0);
}

// Two CTAs per SM: at most 64 registers.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
softmax_cluster_registers(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int cols, int slice) {
  constexpr int V = sm::kVec<T>;
  __shared__ alignas(16) sm::Online inbox[kMaxCluster * kWarps];
  __shared__ alignas(8) uint64_t full;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  open_inbox<sm::Online>(&full, ranks);
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
  exchange(inbox, &full, rank, ranks, sm::warp_merge(sm::Online{m, d}));
  // Lane j merges slots j, j + 32, ...; the butterfly then gives all warps of all CTAs the
  // same bits, so every slice is scaled alike.
  sm::Online r = sm::Online::empty();
  for (int j = threadIdx.x % 32; j < ranks * kWarps; j += 32) r = sm::merge(r, inbox[j]);
  r = sm::warp_merge(r);
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
  __shared__ alignas(16) float inbox[kMaxCluster * kWarps];
  __shared__ alignas(8) uint64_t full;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ranks = int(cluster.num_blocks());
  open_inbox<float>(&full, ranks);
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
  exchange(inbox, &full, rank, ranks, rosetta::warp_sum(dot));
  float total = 0.0f;  // fixed order, then a butterfly: the same bits everywhere
  for (int j = threadIdx.x % 32; j < ranks * kWarps; j += 32) total += inbox[j];
  total = rosetta::warp_sum(total);
#pragma unroll
  for (int i = 0; i < sy.kCount; ++i) {
    const Vec16<T> a = sy.reload(i), b = sg.reload(i);
#pragma unroll
    for (int k = 0; k < V; ++k) sg.v[i].set(k, a.get(k) * (b.get(k) - total));
  }
  sg.store(dx + row * cols + begin, slice);
}

// A cluster of ceil(cols / (512 x 32)) CTAs per row, slices balanced to whole vectors; grids of
// at most 2^31 - 1 CTAs, launched block after block of rows: launch_rows(config, first row,
// ranks, slice). False, having launched nothing, when the row needs more than 16 CTAs or its
// slices are not whole 16-byte vectors from `aligned` starts (every row of every tensor on 16 B).
template <typename T, typename Launch>
bool launch_clusters(int64_t rows, int64_t cols, bool aligned, cudaStream_t stream, cudaError_t& status,
                     Launch launch_rows) {
  constexpr int V = sm::kVec<T>;
  const int64_t ranks = rosetta::ceil_div(cols, kSliceMax<T>);
  if (ranks > kMaxCluster) return false;
  const int64_t slice = rosetta::ceil_div(rosetta::ceil_div(cols, ranks), V) * V;
  if (!aligned || cols != ranks * slice) return false;
  cudaLaunchAttribute cluster_dim{};
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim = {unsigned(ranks), 1, 1};
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &cluster_dim;
  config.numAttrs = 1;
  const int64_t per_launch = INT32_MAX / ranks;
  for (int64_t first = 0; first < rows && status == cudaSuccess; first += per_launch) {
    config.gridDim = dim3(unsigned(ranks * std::min(per_launch, rows - first)));
    status = launch_rows(config, first, int(ranks), int(slice));
  }
  return true;
}

// cudaLaunchKernelEx with clusters of `ranks`, past 8 (the portable size) by opting in.
template <typename Kernel, typename... Args>
cudaError_t launch_kernel(cudaLaunchConfig_t& config, int ranks, Kernel kernel, Args... args) {
  if (ranks > 8) {
    const cudaError_t allowed = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (allowed != cudaSuccess) return allowed;
  }
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// Every row of a rows x cols view with this row stride starts on 16 bytes.
template <typename T>
bool rows_aligned(const T* p, int64_t stride) {
  return rosetta::aligned16(p) && stride % sm::kVec<T> == 0;
}

}  // namespace

cudaError_t softmax_07_cluster_registers(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    T* out = a.out.ptr<T>();
    const int64_t xs = a.x.stride[0];
    if (sm::launch_forward_in_registers(x, xs, out, rows, cols, stream)) return;  // step 5's tiles
    const bool aligned = rows_aligned(x, xs) && rows_aligned(out, cols);
    const bool fits = launch_clusters<T>(rows, cols, aligned, stream, status,
                                         [&](cudaLaunchConfig_t& c, int64_t first, int ranks, int slice) {
      return launch_kernel(c, ranks, softmax_cluster_registers<T>, x + first * xs, xs, out + first * cols, int(cols),
                           slice);
    });
    if (!fits) sm::launch_online(x, xs, out, rows, cols, stream);  // 2 reads + 1 write
  });
  return status != cudaSuccess ? status : launched;
}

cudaError_t softmax_07_cluster_registers_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* y = a.y.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    T* dx = a.dx.ptr<T>();
    const int64_t ys = a.y.stride[0], gs = a.dy.stride[0];
    if (sm::launch_backward_in_registers(y, ys, dy, gs, dx, rows, cols, stream)) return;
    const bool aligned = rows_aligned(y, ys) && rows_aligned(dy, gs) && rows_aligned(dx, cols);
    const bool fits = launch_clusters<T>(rows, cols, aligned, stream, status,
                                         [&](cudaLaunchConfig_t& c, int64_t first, int ranks, int slice) {
      return launch_kernel(c, ranks, backward_cluster_registers<T>, y + first * ys, ys, dy + first * gs, gs,
                           dx + first * cols, int(cols), slice);
    });
    if (!fits) sm::launch_dot_backward(y, ys, dy, gs, dx, rows, cols, stream);  // 4 reads + 1 write
  });
  return status != cudaSuccess ? status : launched;
}
