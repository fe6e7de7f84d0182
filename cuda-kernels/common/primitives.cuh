// Primitives the ladders have taught, shared from here on (llm.c's common.h is the model): a step
// that uses one is still read top to bottom, and neighbouring steps differ by their own idea.
//   warp_reduce / block_reduce  taught by reduce_sum step 8 (warp shuffles)
//   Vec16 loads                 taught by vector_add step 3 (128-bit accesses)
#pragma once

#include "rosetta.cuh"

namespace rosetta {

struct Sum {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static constexpr float identity = 0.0f;
};
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float identity = -INFINITY;
};

// Butterfly over the warp: every lane ends with the result (xor, not down: no broadcast needed).
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op = Op{}) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<Sum>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<Max>(v); }

// Every thread of the block gets the result. `scratch` holds kThreads / 32 floats; the trailing
// barrier lets the caller reuse it for the next reduction at once.
template <int kThreads, typename Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch, Op op = Op{}) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32 of them");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_reduce(lane < kThreads / 32 ? scratch[lane] : Op::identity, op);
  __syncthreads();
  return v;
}

// 16 bytes of T as one uint4: 4 fp32 or 8 fp16/bf16 per load or store instruction.
template <typename T>
struct Vec16 {
  static constexpr int kCount = 16 / sizeof(T);
  uint4 raw;
  __device__ __forceinline__ float get(int k) const { return to_float(reinterpret_cast<const T*>(&raw)[k]); }
  __device__ __forceinline__ void set(int k, float v) { reinterpret_cast<T*>(&raw)[k] = from_float<T>(v); }
  __device__ __forceinline__ float sum() const {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kCount; ++k) s += get(k);
    return s;
  }
};

// True when p sits on a 16-byte boundary (vector accesses through it are legal).
__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace rosetta
