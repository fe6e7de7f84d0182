/*
Step 4 — first add during the global load (Harris's kernel 4)
Changed:  a block of 256 threads now covers 512 elements: thread t loads in[i] and in[i + 256]
          and stores their sum to shared memory; the tree is unchanged.
Why:      step 3 left half its threads idle from the first round on. Here every thread adds at
          least once, there are half as many blocks (and partials), and each thread has two
          loads in flight.
Still:    the tree's last rounds run with fewer than 32 active threads, yet pay a full
          __syncthreads() and loop overhead each.
Limits:   none. Multi-pass: ceil(n/512) partials per pass.
*/
#include "reduce.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kPerBlock = 2 * kThreads;

template <typename T>
__global__ void reduce_first_add(const T* __restrict__ in, int64_t n, float* __restrict__ partials) {
  __shared__ float s[kThreads];
  const unsigned t = threadIdx.x;
  const int64_t i = int64_t(blockIdx.x) * kPerBlock + t;
  float v = i < n ? rosetta::to_float(in[i]) : 0.0f;
  if (i + kThreads < n) v += rosetta::to_float(in[i + kThreads]);  // the first add, on load
  s[t] = v;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = s[0];
}

}  // namespace

cudaError_t reduce_sum_04_first_add_on_load(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  auto blocks_for = [](int64_t n) { return rosetta::ceil_div(n, kPerBlock); };
  auto pass = [&](const auto* in, int64_t n, float* dst, int64_t blocks) {
    reduce_first_add<<<blocks, kThreads, 0, stream>>>(in, n, dst);  // T deduced from `in`
  };
  return rosetta::reduce_in_passes(a, stream, blocks_for, pass);
}
