// Shared by every step: element types, the tensor view every launcher receives, the workspace
// allocator, and dtype dispatch. No torch header here or in any .cu file: the kernels compile with
// plain nvcc (CI does that), and the generated binding is the only code that sees both.
//
// Each op's argument struct (VectorAddArgs, SoftmaxArgs, SoftmaxBackwardArgs, MatmulArgs, ...) is
// generated from its spec in bindings/ops/<op>.py into rosetta_ops.h: one `Tensor` per input and
// output, named as in the spec, then a `Workspace`. A step's launcher is
//   cudaError_t <op>_<NN>_<name>(const rosetta::<Op>Args&, cudaStream_t);
// and, for an op with a backward, <op>_<NN>_<name>_backward(const rosetta::<Op>BackwardArgs&, ...).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace rosetta {

// Values match bindings/cuda_codegen.py (torch dtype -> DType).
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

constexpr int kMaxDims = 4;

// A strided view of a device tensor, as the op's spec shaped it (softmax: rows x cols; matmul:
// M x K, K x N; vector_add and reduce_sum: 1-D). Sizes and strides count elements, not bytes.
// What a step may assume about the strides is its header's `Layout:` line, checked before launch:
//   contiguous: row-major, no gaps;  rows: the last stride is 1 (rows may be apart, e.g. x[:, :n]);
//   any: every stride is honoured (a.t() included).
struct Tensor {
  void* data;
  DType dtype;
  int dim;
  int64_t numel;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];

  template <typename T> T* ptr() const { return static_cast<T*>(data); }
};

// Scratch device memory for the duration of one launch, stream-ordered (the binding takes it from
// torch's caching allocator, so a steady-state call does no cudaMalloc). Uninitialised.
struct Workspace {
  void* (*alloc)(void* context, int64_t bytes);
  void* context;
  template <typename T> T* get(int64_t count) const {
    return static_cast<T*>(alloc(context, count * int64_t(sizeof(T))));
  }
};

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

template <typename T> constexpr DType dtype_v = DType::f32;
template <> constexpr DType dtype_v<__half> = DType::f16;
template <> constexpr DType dtype_v<__nv_bfloat16> = DType::bf16;

// Calls f(T{}) with T the C++ element type of `d`, among Ts only: each type is instantiated once.
template <typename... Ts, typename F> cudaError_t dispatch_among(DType d, F&& f) {
  const bool found = ((d == dtype_v<Ts> ? (f(Ts{}), true) : false) || ...);
  return found ? cudaGetLastError() : cudaErrorInvalidValue;
}

// A step's `Dtypes:` header line becomes ROSETTA_DTYPES when its file is compiled (the build and
// CI's nvcc check both pass it), so a step instantiates exactly the types it declares.
#ifndef ROSETTA_DTYPES
#define ROSETTA_DTYPES float, __half, __nv_bfloat16
#endif

template <typename F> cudaError_t dispatch_dtype(DType d, F&& f) {
  return dispatch_among<ROSETTA_DTYPES>(d, static_cast<F&&>(f));
}

// Blocks for `n` items at `per_block` items a block (n > 0).
__host__ __device__ inline int64_t ceil_div(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

// An attribute of the current device, read once per device (the current device may change
// between calls; one cache per attribute).
template <cudaDeviceAttr kAttr>
inline int device_attribute() {
  static int values[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (values[device] == 0) cudaDeviceGetAttribute(&values[device], kAttr, device);
  return values[device];
}

// The number of SMs of the current device: grids "sized to the machine" use it.
inline int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }

}  // namespace rosetta

#include "rosetta_ops.h"  // generated: the per-op argument structs
