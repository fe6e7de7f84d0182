/*
Step 2 — interleaved addressing, strided index (Harris's kernel 2)
Changed:  in round s, thread t works on index 2*s*t (if it is < 256): the working threads are now
          the first 256/(2s) of the block, contiguous, so whole warps retire instead of diverging.
Why:      removes step 1's divergence and its `%`: warps with no work skip the add entirely.
Still:    shared-memory bank conflicts: lanes t and t+16 hit index 2st and 2s(t+16), which for
          s >= 16 land in the same bank -- up to 16-way conflicts in the middle rounds.
Limits:   none. Multi-pass as in step 1.
*/
#include "reduce.cuh"

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void reduce_interleaved_strided(const T* __restrict__ in, int64_t n, float* __restrict__ partials) {
  __shared__ float s[kThreads];
  const unsigned t = threadIdx.x;
  const int64_t i = int64_t(blockIdx.x) * kThreads + t;
  s[t] = i < n ? rosetta::to_float(in[i]) : 0.0f;
  __syncthreads();
  for (unsigned stride = 1; stride < kThreads; stride *= 2) {
    const unsigned index = 2 * stride * t;  // contiguous threads, strided (conflicting) addresses
    if (index < kThreads) s[index] += s[index + stride];
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = s[0];
}

}  // namespace

cudaError_t reduce_sum_02_interleaved_strided(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  auto blocks_for = [](int64_t n) { return rosetta::ceil_div(n, kThreads); };
  auto pass = [&](const auto* in, int64_t n, float* dst, int64_t blocks) {
    reduce_interleaved_strided<<<blocks, kThreads, 0, stream>>>(in, n, dst);  // T deduced from `in`
  };
  return rosetta::reduce_in_passes(a, stream, blocks_for, pass);
}
