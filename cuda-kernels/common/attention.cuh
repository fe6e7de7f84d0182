// Pieces every attention step shares (cuda-kernels/attention/), taught by step 1:
//   Heads<T>, heads<T>(tensor)        a (B, H, rows, ...) tensor addressed by (bh, row), any strides for
//                                     dims 0-2 (B, H, rows), int64 offsets; bh = b * H + h
//       Heads<T>::head(bh)            -> T* to row 0 of head bh
//       Heads<T>::row(bh, r)          -> T* to row r of head bh (lse: the element itself)
//   keys_seen(i, Sk, causal)          how many keys query i sees: key j is masked for query i when
//                                     causal && j > i (top-left aligned, as SDPA's is_causal, also
//                                     for Sq != Sk); every query sees key 0, so no row is empty
//   masked(i, j, causal)              that rule for one (query, key) pair
//   delta_rows<T><<<delta_grid(rows), kDeltaThreads>>>(out, dout, delta, BH, Sq, D)
//                                     the backward's delta[bh * Sq + i] = sum_d dout[bh,i,d] out[bh,i,d]
//                                     (fp32, contiguous, one warp per row)
//   zero_heads<T>(x, BH, rows, D, stream)  writes zeros to a (BH, rows, D) strided tensor (a gradient
//                                     over no queries); launches nothing for an empty one
//   aligned_heads(tensor, elems)      every row start of every head is `elems`-element aligned
//                                     (with a 16-byte aligned base): 16-byte vector loads are legal
// Only templates and inline functions: several steps include this header in one extension.
#pragma once

#include <climits>

#include "primitives.cuh"

namespace rosetta::attn {

template <typename T>
struct Heads {
  T* data;
  int64_t heads;                        // H: bh splits into (bh / H, bh % H)
  int64_t batch_stride, head_stride, row_stride;  // elements

  __host__ __device__ __forceinline__ T* head(int64_t bh) const {
    return data + (bh / heads) * batch_stride + (bh % heads) * head_stride;
  }
  __host__ __device__ __forceinline__ T* row(int64_t bh, int64_t r) const { return head(bh) + r * row_stride; }
};

// q, k, v, out, dout, dq, dk, dv (4-D) and lse (3-D, one element a row) alike: strides 0, 1, 2.
template <typename T>
inline Heads<T> heads(const Tensor& t) {
  return Heads<T>{static_cast<T*>(t.data), t.size[1] > 0 ? t.size[1] : 1, t.stride[0], t.stride[1], t.stride[2]};
}

__host__ __device__ __forceinline__ int64_t keys_seen(int64_t i, int64_t seq_k, bool causal) {
  return causal ? (i + 1 < seq_k ? i + 1 : seq_k) : seq_k;
}
__host__ __device__ __forceinline__ bool masked(int64_t i, int64_t j, bool causal) { return causal && j > i; }

// 16-byte loads of a head's rows need the base and every batch, head and row stride aligned.
inline bool aligned_heads(const Tensor& t, int elems) {
  return aligned16(t.data) && t.stride[0] % elems == 0 && t.stride[1] % elems == 0 && t.stride[2] % elems == 0;
}

constexpr int kDeltaThreads = 256;  // 8 rows a block, a warp each

inline unsigned delta_grid(int64_t rows) {
  return unsigned(std::min<int64_t>(ceil_div(rows, kDeltaThreads / 32), INT_MAX));
}

// delta_i = dout_i . out_i, the row term of dS = P (dP - delta): a warp per row, lanes along d
// (coalesced 2-byte loads: any row alignment), fp32, warp-shuffle sum.
template <typename T>
__global__ void __launch_bounds__(kDeltaThreads)
delta_rows(Heads<const T> out, Heads<const T> dout, float* __restrict__ delta, int64_t bh_count, int64_t seq_q,
           int head_dim) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = bh_count * seq_q;
  for (int64_t r = int64_t(blockIdx.x) * (kDeltaThreads / 32) + threadIdx.x / 32; r < rows;
       r += int64_t(gridDim.x) * (kDeltaThreads / 32)) {
    const int64_t bh = r / seq_q, i = r % seq_q;
    const T* o = out.row(bh, i);
    const T* g = dout.row(bh, i);
    float s = 0.0f;
    for (int d = lane; d < head_dim; d += 32) s += to_float(o[d]) * to_float(g[d]);
    s = warp_sum(s);  // the loop is warp-uniform (r is), so every lane reaches the shuffle
    if (lane == 0) delta[r] = s;
  }
}

template <typename T>
__global__ void __launch_bounds__(256) zero_heads_kernel(Heads<T> x, int64_t bh_count, int64_t rows, int head_dim) {
  const int64_t n = bh_count * rows * head_dim;
  for (int64_t e = int64_t(blockIdx.x) * 256 + threadIdx.x; e < n; e += int64_t(gridDim.x) * 256) {
    const int64_t r = e / head_dim;
    x.row(r / rows, r % rows)[e % head_dim] = from_float<T>(0.0f);
  }
}

template <typename T>
inline void zero_heads(const Tensor& t, int64_t bh_count, int64_t rows, int head_dim, cudaStream_t stream) {
  const int64_t n = bh_count * rows * head_dim;
  if (n == 0) return;
  zero_heads_kernel<T><<<unsigned(std::min<int64_t>(ceil_div(n, 256), 65536)), 256, 0, stream>>>(
      heads<T>(t), bh_count, rows, head_dim);
}

}  // namespace rosetta::attn
