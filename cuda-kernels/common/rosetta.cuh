// Shared by every step: element types, the launcher argument structs, and dtype dispatch.
// No torch header here or in any .cu file: the kernels compile with plain nvcc (CI does that),
// and bindings/binding.cpp is the only place that sees both torch and these launchers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace rosetta {

// Values match bindings/cuda_build.py (torch dtype -> DType).
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

// Every vector_add step has this launcher: out[i] = x[i] + y[i], i < n, contiguous buffers.
struct VectorAddArgs {
  const void* x;
  const void* y;
  void* out;
  int64_t n;
  DType dtype;
};

// Every reduce_sum step has this launcher: *out = sum(x[0..n)), fp32 accumulation.
// `workspace` holds reduce_sum_workspace_floats(n) floats, uninitialised (zeroing n/64 floats would
// cost 6% of the input's bytes): multi-launch steps keep partial sums there, and a step that needs
// zeroed counters (or a zeroed *out) clears those few bytes itself, on the stream.
struct ReduceSumArgs {
  const void* x;
  float* out;
  int64_t n;
  DType dtype;
  float* workspace;
  int64_t workspace_floats;
};

// Enough for one partial per 64 input elements plus a machine-sized grid's partials and counters.
inline int64_t reduce_sum_workspace_floats(int64_t n) { return n / 64 + 8192; }

// torch compiles CUDA with -D__CUDA_NO_HALF_OPERATORS__ (no operator+ on __half), so all
// arithmetic goes through float: the same rounding torch uses for half/bfloat16 math.
__host__ __device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls f(T{}) with T the C++ element type of `d`: one switch instead of one per launcher.
template <typename F> cudaError_t dispatch_dtype(DType d, F&& f) {
  switch (d) {
    case DType::f32: f(float{}); break;
    case DType::f16: f(__half{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// Blocks for `n` items at `per_block` items a block (n > 0).
inline int64_t ceil_div(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

// The number of SMs of the current device, read once: grids "sized to the machine" use it.
inline int sm_count() {
  static int count = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms;
  }();
  return count;
}

}  // namespace rosetta
