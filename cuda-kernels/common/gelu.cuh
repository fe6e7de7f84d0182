// linear_gelu's pieces besides the GEMM (gemm_sm90.cuh), shared by its steps:
//   gelu, gelu_grad               the tanh GELU and its derivative in fp32
//   matrix, transposed, padded_cols   Tensor views of the backward's operands (dz, a^T, weight^T)
// dbias's partial rows are summed by norm.cuh's reduce_partials (a fixed order, no atomics).
#pragma once

#include <type_traits>

#include "gemm_sm90.cuh"
#include "norm.cuh"

namespace rosetta::gelu {

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;

// 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^(-2u)), u = sqrt(2/pi) (z + 0.044715 z^3): one
// ex2 and one reciprocal (MUFU) plus ~6 FMA-pipe ops, where tanhf is ~20 instructions with a
// branch. Relative error a few fp32 ulps (e^(-2u) overflows to inf for z < ~-9: s = 0, exact
// to fp32). No cancellation: 1 + tanh never appears as a difference.
__device__ __forceinline__ float sigmoid_2u(float z) {
  const float u = kSqrt2OverPi * z * fmaf(kCubic, z * z, 1.0f);
  return __fdividef(1.0f, 1.0f + __expf(-2.0f * u));
}

// gelu(z) = 0.5 z (1 + tanh(u)), rounded to T. bf16 keeps 8 bits: there the hardware tanh
// (tanh.approx.f32: one MUFU.TANH, absolute error < 2^-10.9, under bf16's rounding) and 4
// FMA-pipe ops, half the MUFU work of sigmoid_2u's ex2 + reciprocal, which is what bounds a fused
// epilogue (MUFU issues 16 a clock an SM against 128 FMAs). fp16 keeps 11 bits, which that error
// would exceed: it takes z * sigmoid_2u(z).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
template <typename T>
__device__ __forceinline__ float gelu(float z) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const float u = z * fmaf(kSqrt2OverPi * kCubic, z * z, kSqrt2OverPi);
    const float half_z = 0.5f * z;
    return fmaf(half_z, tanh_approx(u), half_z);
  } else {
    return z * sigmoid_2u(z);
  }
}

// gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) u'(z), with 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s):
// s + 2 z s (1 - s) u', u' = sqrt(2/pi) (1 + 3 * 0.044715 z^2).
__device__ __forceinline__ float gelu_grad(float z) {
  const float s = sigmoid_2u(z);
  const float du = kSqrt2OverPi * fmaf(3.0f * kCubic, z * z, 1.0f);
  return fmaf(2.0f * z * s * (1.0f - s), du, s);
}

// ------------------------------------------------------------------------------------------------
// Host helpers

// A 2-D view of `data` (rows x cols, strides s0, s1 in elements): the GEMM operands the backward
// builds (dz) and the transposed views of a and weight.
inline Tensor matrix(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  Tensor t{};
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.dim = 2;
  t.numel = rows * cols;
  t.size[0] = rows, t.size[1] = cols;
  t.stride[0] = s0, t.stride[1] = s1;
  return t;
}
// x^T: the other major-ness of the same memory (a TMA map reads it in place).
inline Tensor transposed(const Tensor& x) {
  return matrix(x.data, x.dtype, x.size[1], x.size[0], x.stride[1], x.stride[0]);
}
// The backward's dz buffer has rows of N rounded up to 8 elements (16 bytes): it is a TMA operand
// of the da and dweight GEMMs, and TMA needs 16-byte row pitches even where N is odd.
inline int64_t padded_cols(int64_t n) { return (n + 7) / 8 * 8; }

}  // namespace rosetta::gelu
