/*
Step 4 — online softmax: the max and the sum in one pass
Changed:  the first two walks become one (Milakov & Gimelshein 2018): each thread keeps a pair
          (m, d) -- its running max and the sum of exp(x - m) -- and for each 16-byte vector
          takes the vector's max, rescales d by exp(m_old - m_new) once and adds the vector's
          exps. Pairs merge the same way across the warp (shuffles) and the block:
          d = d_a exp(m_a - m) + d_b exp(m_b - m). A pair whose max is still -inf (only -inf so
          far) takes its exps against 0, not -inf: exp(-inf - -inf) is NaN and would poison
          the later elements of a row like [-inf, 1] (softmax.cuh: Online, merge, block_merge,
          which steps 5-8 reuse). Backward: step 3's kernel, called through step 3's entry
          point: its one pass for the dot is already minimal for a two-walk backward (2 + 2
          reads + 1 write).
Why:      3 reads + 1 write (4n) -> 2 reads + 1 write (3n). Where the re-reads came from DRAM
          (long rows: a wave of 1,056 rows of 256 KB is far past the 50 MB L2) the ceiling moves
          from 2n/4n to 2n/3n of copy bandwidth: ~1,400 -> ~2,000 GB/s on bf16 4096 x 131072
          and fp32 4096 x 262144 (4/3 faster). Short rows whose re-reads hit L2 gain less
          (L2 traffic 4n -> 3n): ~10-25%. The cost: one extra exp per 16-byte vector.
Still:    the row is still read twice. Step 5 keeps it on chip (registers or shared memory)
          between the reduction and the write: 1 read + 1 write.
Limits:   none (any row length; 64-bit offsets).
Layout:   rows
*/
#include "softmax.cuh"

// Step 3's backward, which this step keeps (03_warp_shuffle_vectorized.cu).
cudaError_t softmax_03_warp_shuffle_vectorized_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream);

namespace {

namespace sm = rosetta::softmax;
using rosetta::Vec16;
constexpr int kThreads = 256;  // one row per block, as step 3

// Read 1 folds every vector into the thread's (max, sum) pair; the block merges the pairs; read 2
// writes exp(x - m) / d. Steps 5-8 hand this kernel the rows too long for them.
template <typename T>
__global__ void __launch_bounds__(kThreads)
softmax_online(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int64_t cols) {
  constexpr int V = sm::kVec<T>;
  __shared__ sm::Online scratch[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // block-uniform: barriers inside
    const T* in = x + row * x_stride;
    T* o = out + row * cols;
    const bool vin = rosetta::aligned16(in), vout = rosetta::aligned16(o);
    sm::Online t = sm::Online::empty();  // read 1: max and sum together
    for (int64_t c = int64_t(threadIdx.x) * V; c < cols; c += kThreads * V)
      t.add(sm::load_vec(in, c, cols, vin, -INFINITY));
    const sm::Online r = sm::block_merge<kThreads>(t, scratch);
    const float inv = 1.0f / r.d;
    for (int64_t c = int64_t(threadIdx.x) * V; c < cols; c += kThreads * V) {  // read 2, write
      Vec16<T> v = sm::load_vec(in, c, cols, vin, -INFINITY);
#pragma unroll
      for (int k = 0; k < V; ++k) v.set(k, __expf(v.get(k) - r.m) * inv);  // r.m = -inf: NaN, as torch
      sm::store_vec(o, c, cols, vout, v);
    }
  }
}

}  // namespace

cudaError_t softmax_04_online(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    softmax_online<T><<<sm::row_grid(rows), kThreads, 0, stream>>>(a.x.ptr<const T>(), a.x.stride[0],
                                                                   a.out.ptr<T>(), rows, cols);
  });
}

cudaError_t softmax_04_online_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  return softmax_03_warp_shuffle_vectorized_backward(a, stream);
}
