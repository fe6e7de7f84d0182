/*
Step 6 — completely unrolled, block size as a template parameter (Harris's kernel 6)
Changed:  the kernel takes its block size as a template parameter, so every round of the tree is
          an `if constexpr` the compiler resolves: no loop, no loop counter, no dead rounds.
Why:      with the size known at compile time, the 8 rounds become straight-line code: fewer
          instructions per element and none spent on loop control.
Still:    each thread still loads only two elements, and there are n/512 blocks: block launch and
          the tree's barriers are paid for every 512 elements. The next step gives each thread
          many elements.
Limits:   none. Multi-pass: ceil(n/512) partials per pass.
*/
#include "reduce.cuh"

namespace {

constexpr int kThreads = 256;

template <int kBlock>
__device__ __forceinline__ void last_warp(float* s, unsigned t) {
  float v = s[t];
#pragma unroll
  for (int offset = 32; offset > 0; offset /= 2) {
    if (kBlock >= 2 * offset) {  // a compile-time condition: the round exists or it does not
      v += s[t + offset];
      __syncwarp();
      s[t] = v;
      __syncwarp();
    }
  }
}

template <int kBlock, typename T>
__global__ void __launch_bounds__(kBlock)
reduce_full_unroll(const T* __restrict__ in, int64_t n, float* __restrict__ partials) {
  static_assert(kBlock >= 64 && kBlock <= 1024 && (kBlock & (kBlock - 1)) == 0,
                "the tree assumes a power-of-two block of 64..1024 threads");
  __shared__ float s[kBlock];
  const unsigned t = threadIdx.x;
  const int64_t i = int64_t(blockIdx.x) * (2 * kBlock) + t;
  float v = i < n ? rosetta::to_float(in[i]) : 0.0f;
  if (i + kBlock < n) v += rosetta::to_float(in[i + kBlock]);
  s[t] = v;
  __syncthreads();
  if constexpr (kBlock >= 1024) { if (t < 512) s[t] += s[t + 512]; __syncthreads(); }
  if constexpr (kBlock >= 512) { if (t < 256) s[t] += s[t + 256]; __syncthreads(); }
  if constexpr (kBlock >= 256) { if (t < 128) s[t] += s[t + 128]; __syncthreads(); }
  if constexpr (kBlock >= 128) { if (t < 64) s[t] += s[t + 64]; __syncthreads(); }
  if (t < 32) last_warp<kBlock>(s, t);
  if (t == 0) partials[blockIdx.x] = s[0];
}

}  // namespace

cudaError_t reduce_sum_06_full_unroll(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  auto blocks_for = [](int64_t n) { return rosetta::ceil_div(n, 2 * kThreads); };
  auto pass = [&](const auto* in, int64_t n, float* dst, int64_t blocks) {
    reduce_full_unroll<kThreads><<<blocks, kThreads, 0, stream>>>(in, n, dst);  // T deduced from `in`
  };
  return rosetta::reduce_in_passes(a, stream, blocks_for, pass);
}
