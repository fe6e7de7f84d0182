// Pieces of the softmax ladder that later steps share, each taught by the first step that uses it:
//   load_vec / store_vec           a row's 16-byte vectors, masked and scalar off the aligned path  step 3
//   shift, load_at / store_at      a row off 16 bytes read as the 16-byte vectors it overlaps       step 5
//   Online, merge, block_merge     (max, sum of exp) pairs merged in one pass, -inf-safe           step 4
//   row_grid                       a block per row, the grid capped at 2^31 - 1 blocks              step 4
//   max_dynamic_smem               the opt-in shared memory a block may ask for                    step 5
//   rows_aligned                   every row of a view starts on 16 bytes                         step 5
//   launch_forward / _backward     the host side of steps 6-8: nothing to do for an empty input,
//                                  every other row to the step's own kernels
// Every step's kernels, forward and backward, live in its own file, and a step runs only them: the
// rows it is not meant for are declared in its header (`Min:` / `Max:`), checked before launch, and
// left to the dispatcher, which picks another step for them.
// Every kernel takes rows x cols with a row stride for its inputs (Layout: rows) and contiguous
// outputs; rows and the offsets into them are 64-bit.
#pragma once

#include <algorithm>

#include "primitives.cuh"

namespace rosetta::softmax {

template <typename T> constexpr int kVec = Vec16<T>::kCount;  // elements per 16-byte vector

// ---------------------------------------------------------------------------------------------
// Row access (step 3)

// Elements [c, c + kVec) of a row of n: one 16-byte load when the row starts 16-byte aligned
// (`vec`; c is a multiple of kVec) and the vector lies inside the row, else one element at a
// time with `fill` past the end (-inf: adds nothing to a max or, after exp, to a sum).
template <typename T>
__device__ __forceinline__ Vec16<T> load_vec(const T* row, int64_t c, int64_t n, bool vec, float fill) {
  Vec16<T> v;
  if (vec && c + kVec<T> <= n) {
    v.raw = *reinterpret_cast<const uint4*>(row + c);
  } else {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) v.set(k, c + k < n ? to_float(row[c + k]) : fill);
  }
  return v;
}

// The store that matches load_vec: elements at or past n are not written.
template <typename T>
__device__ __forceinline__ void store_vec(T* row, int64_t c, int64_t n, bool vec, const Vec16<T>& v) {
  if (vec && c + kVec<T> <= n) {
    *reinterpret_cast<uint4*>(row + c) = v.raw;
  } else {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k)
      if (c + k < n) row[c + k] = reinterpret_cast<const T*>(&v.raw)[k];
  }
}

// ---------------------------------------------------------------------------------------------
// Rows off a 16-byte boundary (steps 5-6). A row that starts s = shift(row) elements past a
// boundary is read as the 16-byte vectors of memory it overlaps: vector j holds elements
// [j V - s, j V - s + V), ceil((n + s) / V) vectors cover it, and only the first (its head of
// V - s elements) and the last are partial. Another tensor of the same row (the output; the
// backward's dy and dx) goes through the same vectors: whole 16-byte accesses where it starts s
// elements past a boundary too, element by element where it does not.

// Elements from the 16-byte boundary at or before p to p (p holds whole elements: < kVec).
template <typename T>
__device__ __forceinline__ int shift(const T* p) {
  return int(reinterpret_cast<uintptr_t>(p) % 16 / sizeof(T));
}

// Vector j of a row of n that starts s elements past a boundary (its elements c = j V - s + k):
// one 16-byte load from the boundary when `vec` (the row does start s past one) and the vector
// lies inside [0, n), else element by element, `fill` outside the row. 32-bit indices: rows on
// chip are far shorter than 2^31. Addressed as vector j of row - s: addressed as row + c, nvcc
// 13 split store_at's 16-byte store into four 4-byte ones; __ldg keeps step 6's loads on the
// read-only path (LDG.E.128.CONSTANT), which it otherwise lost.
template <typename T>
__device__ __forceinline__ Vec16<T> load_at(const T* row, int s, int j, int n, bool vec, float fill) {
  const int c = j * kVec<T> - s;
  Vec16<T> v;
  if (vec && c >= 0 && c + kVec<T> <= n) {
    v.raw = __ldg(reinterpret_cast<const uint4*>(row - s) + j);  // read-only: the kernels' inputs
  } else {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) v.set(k, unsigned(c + k) < unsigned(n) ? to_float(__ldg(row + c + k)) : fill);
  }
  return v;
}

// The store that matches load_at: elements outside [0, n) are not written.
template <typename T>
__device__ __forceinline__ void store_at(T* row, int s, int j, int n, bool vec, const Vec16<T>& v) {
  const int c = j * kVec<T> - s;
  if (vec && c >= 0 && c + kVec<T> <= n) {
    reinterpret_cast<uint4*>(row - s)[j] = v.raw;
  } else {
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k)
      if (unsigned(c + k) < unsigned(n)) row[c + k] = reinterpret_cast<const T*>(&v.raw)[k];
  }
}

// The backward's vectors (y, dy and dx each start shift() elements past a boundary): y's, unless
// dy and dx share a shift that y lacks (two tensors of three whole, not one).
__device__ __forceinline__ int backward_shift(int y, int dy, int dx) { return dy == dx && y != dy ? dy : y; }

// ---------------------------------------------------------------------------------------------
// Online softmax (step 4): Milakov & Gimelshein 2018. A pair (m, d) stands for "max m, and the
// sum of exp(x - m)"; two pairs merge without a second look at the data.

// The reference that exp(x - ref) is taken against. A max still at -inf has only seen -inf (or
// NaN): exp(-inf - -inf) would be NaN and poison every later element, so such a pair is kept
// against 0 instead, where its -inf elements add exp(-inf) = 0 (a NaN still adds NaN).
__device__ __forceinline__ float reference(float m) { return m == -INFINITY ? 0.0f : m; }

struct Online {
  float m, d;  // no initialisers: an aggregate, so __shared__ arrays of it are legal

  static __device__ __forceinline__ Online empty() { return {-INFINITY, 0.0f}; }  // merge's identity

  // One vector of elements: its max first, then a single rescale of the running sum.
  template <typename T>
  __device__ __forceinline__ void add(const Vec16<T>& v) {
    float vmax = v.get(0);
#pragma unroll
    for (int k = 1; k < kVec<T>; ++k) vmax = fmaxf(vmax, v.get(k));  // fmaxf skips NaN: d catches it
    const float m_new = fmaxf(m, vmax), ref = reference(m_new);
    float s = d * __expf(m - ref);  // m = -inf: 0 * exp(-inf) = 0; m = m_new = +inf: NaN, as torch
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) s += __expf(v.get(k) - ref);
    m = m_new;
    d = s;
  }
};

__device__ __forceinline__ Online merge(const Online& a, const Online& b) {
  Online r;
  r.m = fmaxf(a.m, b.m);
  const float ref = reference(r.m);
  r.d = a.d * __expf(a.m - ref) + b.d * __expf(b.m - ref);
  return r;
}

// Butterfly over the warp. Both partners compute merge(lower lane, upper lane) -- the same
// operands in the same order -- so every lane ends with bit-identical (m, d).
__device__ __forceinline__ Online warp_merge(Online a) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    Online b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, offset);
    b.d = __shfl_xor_sync(0xffffffffu, a.d, offset);
    a = (lane & offset) ? merge(b, a) : merge(a, b);
  }
  return a;
}

// Every thread gets the block's pair. `scratch` holds kThreads / 32 pairs; the trailing barrier
// lets the caller reuse it at once (as rosetta::block_reduce does).
template <int kThreads>
__device__ __forceinline__ Online block_merge(Online a, Online* scratch) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32 of them");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  a = warp_merge(a);
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  a = warp_merge(lane < kThreads / 32 ? scratch[lane] : Online::empty());
  __syncthreads();
  return a;
}

// ---------------------------------------------------------------------------------------------
// Host pieces

// Dynamic shared memory one block may opt in to (227 KB on an H100), less room for a kernel's
// static arrays.
inline int64_t max_dynamic_smem() {
  return rosetta::device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>() - 1024;
}

// One block per row; the row loop inside covers grids capped at 2^31 - 1 blocks.
inline unsigned row_grid(int64_t rows, int64_t rows_per_block = 1) {
  return unsigned(std::min<int64_t>(ceil_div(rows, rows_per_block), INT32_MAX));
}

// Every row of a rows x cols view with this row stride starts on 16 bytes.
template <typename T>
bool rows_aligned(const T* p, int64_t stride) {
  return aligned16(p) && stride % kVec<T> == 0;
}

// Elements to add to cols where shifted rows may need one vector more (ceil((cols + s) / V) with
// s < V): none when every row of the input(s) starts on 16 bytes (s = 0).
template <typename T>
int64_t shift_pad(bool aligned) {
  return aligned ? 0 : kVec<T> - 1;
}

// The longest row step 5 holds in registers (its block tiles: 512 threads x 32 values); steps 6-8
// are meant for the rows past it (their `Min: cols >= 16385`).
constexpr int64_t kMaxRegisterCols = 16384;

// Host side of steps 6-8: nothing to write for an empty input; every row to the step's own idea,
//   long_rows(T{}, x, x_stride, out) -> cudaError_t      (forward)
//   long_rows(T{}, y, y_stride, dy, dy_stride, dx)       (backward)
template <typename LongRows>
cudaError_t launch_forward(const SoftmaxArgs& a, cudaStream_t stream, LongRows long_rows) {
  if (a.x.size[0] == 0 || a.x.size[1] == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = long_rows(tag, a.x.ptr<const T>(), a.x.stride[0], a.out.ptr<T>());
  });
  return status != cudaSuccess ? status : launched;
}

template <typename LongRows>
cudaError_t launch_backward(const SoftmaxBackwardArgs& a, cudaStream_t stream, LongRows long_rows) {
  if (a.y.size[0] == 0 || a.y.size[1] == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = dispatch_dtype(a.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = long_rows(tag, a.y.ptr<const T>(), a.y.stride[0], a.dy.ptr<const T>(), a.dy.stride[0], a.dx.ptr<T>());
  });
  return status != cudaSuccess ? status : launched;
}

}  // namespace rosetta::softmax
