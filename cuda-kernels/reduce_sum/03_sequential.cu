/*
Step 3 — sequential addressing (Harris's kernel 3)
Changed:  in round s (s = 128, 64, ..., 1), thread t < s adds s[t + s] into s[t]: the active
          threads and the addresses they touch are both contiguous.
Why:      a warp reads 32 consecutive floats (one per bank) in every round: no bank conflicts,
          and still no divergence inside the active warps.
Still:    half the threads do nothing after the load (the first round already uses only 128 of
          256), and each thread loads a single element: too few bytes in flight per thread.
Limits:   none. Multi-pass as in step 1.
*/
#include "reduce.cuh"

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void reduce_sequential(const T* __restrict__ in, int64_t n, float* __restrict__ partials) {
  __shared__ float s[kThreads];
  const unsigned t = threadIdx.x;
  const int64_t i = int64_t(blockIdx.x) * kThreads + t;
  s[t] = i < n ? rosetta::to_float(in[i]) : 0.0f;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];  // consecutive lanes, consecutive banks
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = s[0];
}

}  // namespace

cudaError_t reduce_sum_03_sequential(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  auto blocks_for = [](int64_t n) { return rosetta::ceil_div(n, kThreads); };
  auto pass = [&](const auto* in, int64_t n, float* dst, int64_t blocks) {
    reduce_sequential<<<blocks, kThreads, 0, stream>>>(in, n, dst);  // T deduced from `in`
  };
  return rosetta::reduce_in_passes(a, stream, blocks_for, pass);
}
