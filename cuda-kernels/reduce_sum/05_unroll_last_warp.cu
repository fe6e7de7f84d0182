/*
Step 5 — unroll the last warp (Harris's kernel 5, made correct for Volta and later)
Changed:  the tree loop stops at 64 active values; the last six rounds run inside warp 0 with
          __syncwarp() instead of __syncthreads(): no block-wide barrier for rounds where only
          one warp works, and no loop overhead for them.
Why:      in step 4, 6 of the 8 rounds have <= 32 active threads but each pays a full barrier
          across 8 warps.
Still:    the tree's shape (256 threads, 8 rounds) is a run-time loop; the block size is known at
          compile time and the loop could vanish.
Limits:   none. Multi-pass: ceil(n/512) partials per pass.
*/
#include "reduce.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kPerBlock = 2 * kThreads;

// Warp 0 folds s[0..64) into s[0]. Each round: read, sync, write, sync -- no lane may read a
// slot before its owner has written it, and none may overwrite a slot before it is read.
__device__ __forceinline__ void last_warp(float* s, unsigned t) {
  float v = s[t];
#pragma unroll
  for (int offset = 32; offset > 0; offset /= 2) {
    v += s[t + offset];
    __syncwarp();
    s[t] = v;
    __syncwarp();
  }
}

template <typename T>
__global__ void reduce_unroll_last_warp(const T* __restrict__ in, int64_t n, float* __restrict__ partials) {
  __shared__ float s[kThreads];
  const unsigned t = threadIdx.x;
  const int64_t i = int64_t(blockIdx.x) * kPerBlock + t;
  float v = i < n ? rosetta::to_float(in[i]) : 0.0f;
  if (i + kThreads < n) v += rosetta::to_float(in[i + kThreads]);
  s[t] = v;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 32; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t < 32) last_warp(s, t);
  if (t == 0) partials[blockIdx.x] = s[0];
}

}  // namespace

cudaError_t reduce_sum_05_unroll_last_warp(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  auto blocks_for = [](int64_t n) { return rosetta::ceil_div(n, kPerBlock); };
  auto pass = [&](const auto* in, int64_t n, float* dst, int64_t blocks) {
    reduce_unroll_last_warp<<<blocks, kThreads, 0, stream>>>(in, n, dst);  // T deduced from `in`
  };
  return rosetta::reduce_in_passes(a, stream, blocks_for, pass);
}
