/*
Step 1 — interleaved addressing, divergent branches (Harris's kernel 1)
Changed:  the starting point: each block loads 256 elements into shared memory, then halves them
          in log2(256) = 8 rounds; in round s, thread t adds s[t + s] into s[t] if t % (2s) == 0.
          One partial per block; the same kernel then reduces the partials (a launch per pass).
Why:      the textbook tree: log-depth, deterministic, fp32 accumulation. It reads each input
          element once (4 B for fp32), so its floor is the DRAM read time: 1 GiB in ~0.33 ms.
Still:    `t % (2s) == 0` keeps every warp busy while only 1/2, 1/4, ... of its lanes work (warp
          divergence), and `%` is slow; half the threads never add anything after loading.
Limits:   none. Multi-pass: ceil(n/256) partials, then ceil(n/65536), ... until one block.
*/
#include "reduce.cuh"

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void reduce_interleaved_divergent(const T* __restrict__ in, int64_t n, float* __restrict__ partials) {
  __shared__ float s[kThreads];
  const unsigned t = threadIdx.x;
  const int64_t i = int64_t(blockIdx.x) * kThreads + t;
  s[t] = i < n ? rosetta::to_float(in[i]) : 0.0f;
  __syncthreads();
  for (unsigned stride = 1; stride < kThreads; stride *= 2) {
    if (t % (2 * stride) == 0) s[t] += s[t + stride];  // active lanes scattered over every warp
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = s[0];
}

}  // namespace

cudaError_t reduce_sum_01_interleaved_divergent(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  auto blocks_for = [](int64_t n) { return rosetta::ceil_div(n, kThreads); };
  auto pass = [&](const auto* in, int64_t n, float* dst, int64_t blocks) {
    reduce_interleaved_divergent<<<blocks, kThreads, 0, stream>>>(in, n, dst);  // T deduced from `in`
  };
  return rosetta::reduce_in_passes(a, stream, blocks_for, pass);
}
