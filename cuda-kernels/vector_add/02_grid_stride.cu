/*
Step 2 — grid-stride loop over a machine-sized grid
Changed:  the grid is a fixed number of blocks per SM (enough to fill the SM's thread slots);
          each thread loops i += gridDim.x * blockDim.x until it passes n.
Why:      step 1 launches ceil(n/256) blocks (2^20 of them at n = 2^28); each block is scheduled,
          runs one add per thread and retires. A resident grid pays that once and keeps each
          thread's index math in registers.
Still:    still one 4-byte (or 2-byte) load per operand per iteration: the memory system wants
          wider requests and more bytes in flight per thread to reach peak bandwidth.
Limits:   none.
*/
#include "rosetta.cuh"

namespace {

template <typename T>
__global__ void vector_add_grid_stride(const T* __restrict__ x, const T* __restrict__ y,
                                       T* __restrict__ out, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = rosetta::from_float<T>(rosetta::to_float(x[i]) + rosetta::to_float(y[i]));
  }
}

}  // namespace

cudaError_t vector_add_02_grid_stride(const rosetta::VectorAddArgs& a, cudaStream_t stream) {
  if (a.x.numel == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  constexpr int kBlocksPerSm = 8;  // 8 x 256 = 2048 threads: a full Hopper SM
  const int64_t blocks = std::min<int64_t>(rosetta::ceil_div(a.x.numel, kThreads),
                                           int64_t(kBlocksPerSm) * rosetta::sm_count());
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    vector_add_grid_stride<T><<<blocks, kThreads, 0, stream>>>(
        a.x.ptr<const T>(), a.y.ptr<const T>(), a.out.ptr<T>(), a.x.numel);
  });
}
