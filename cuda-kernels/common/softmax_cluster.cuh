// Pieces of the softmax cluster steps whose CTAs exchange one message per warp (taught by step 7,
// reused by step 8):
//   open_inbox / exchange          each warp's partial st.async'ed into every peer CTA's inbox,
//                                  completing a transaction on that CTA's mbarrier: one wait
//   inbox_total                    the inbox merged in a fixed order: the same bits in every CTA
//   launch_cluster_rows            cudaLaunchKernelEx with clusters, past 8 CTAs (the portable
//                                  size) by opting in, grids of at most 2^31 - 1 CTAs
#pragma once

#include <algorithm>

#include "hopper.cuh"
#include "softmax.cuh"

namespace rosetta::softmax {

constexpr int kMaxCluster = 16;  // with cudaFuncAttributeNonPortableClusterSizeAllowed

// mapa turns a shared-memory address into the same offset in CTA `rank`'s shared memory;
// st.async writes there and completes `bytes` of a transaction on that CTA's barrier.
__device__ __forceinline__ uint32_t peer_address(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(sm90::smem_u32(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ void send(const Online* slot, uint64_t* bar, int rank, Online p) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
               ::"r"(peer_address(slot, rank)), "f"(p.m), "f"(p.d), "r"(peer_address(bar, rank)) : "memory");
}
__device__ __forceinline__ void send(const float* slot, uint64_t* bar, int rank, float p) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];\n"
               ::"r"(peer_address(slot, rank)), "f"(p), "r"(peer_address(bar, rank)) : "memory");
}

// The barrier expects ranks x kWarps messages of type P; then every thread of every CTA arrives on
// the cluster barrier (relaxed: the fence publishes the initialisation, and any barrier thread 0
// initialised before the call). The matching wait, before the first send, is the caller's: it
// overlaps the loads.
template <int kWarps, typename P>
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
template <int kWarps, typename P>
__device__ __forceinline__ void exchange(P* inbox, uint64_t* bar, int rank, int ranks, P partial) {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // every peer's barrier is ready
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane < ranks) send(&inbox[rank * kWarps + warp], bar, lane, partial);
  sm90::mbarrier_wait(bar, 0);
}

// Lane j merges slots j, j + 32, ...; the butterfly then gives all warps of all CTAs the same
// bits, so every slice is scaled alike.
__device__ __forceinline__ Online inbox_total(const Online* inbox, int count) {
  Online r = Online::empty();
  for (int j = threadIdx.x % 32; j < count; j += 32) r = merge(r, inbox[j]);
  return warp_merge(r);
}
__device__ __forceinline__ float inbox_total(const float* inbox, int count) {
  float total = 0.0f;
  for (int j = threadIdx.x % 32; j < count; j += 32) total += inbox[j];
  return warp_sum(total);
}

// Clusters of `ranks` CTAs of `threads`, one row per cluster, launched block after block of rows
// (grids of at most 2^31 - 1 CTAs): launch_rows(config, first row) -> cudaError_t. `kernel` gets
// the cluster-size opt-in past 8 and the dynamic shared memory it asks for.
template <typename Kernel, typename Launch>
cudaError_t launch_cluster_rows(Kernel kernel, int64_t rows, int ranks, int threads, size_t smem,
                                cudaStream_t stream, Launch launch_rows) {
  cudaError_t status = cudaSuccess;
  if (ranks > 8) status = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (status == cudaSuccess && smem > 48 * 1024)
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  cudaLaunchAttribute cluster_dim{};
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim = {unsigned(ranks), 1, 1};
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &cluster_dim;
  config.numAttrs = 1;
  const int64_t per_launch = INT32_MAX / ranks;
  for (int64_t first = 0; first < rows && status == cudaSuccess; first += per_launch) {
    config.gridDim = dim3(unsigned(ranks * std::min(per_launch, rows - first)));
    status = launch_rows(config, first);
  }
  return status;
}

}  // namespace rosetta::softmax
