/*
Step 4 — online softmax: the max and the sum in one pass
Changed:  the first two walks become one (Milakov & Gimelshein 2018): each thread keeps a pair
          (m, d) -- its running max and the sum of exp(x - m) -- and for each 16-byte vector
          takes the vector's max, rescales d by exp(m_old - m_new) once and adds the vector's
          exps. Pairs merge the same way across the warp (shuffles) and the block:
          d = d_a exp(m_a - m) + d_b exp(m_b - m). A pair whose max is still -inf (only -inf so
          far) takes its exps against 0, not -inf: exp(-inf - -inf) is NaN and would poison
          the later elements of a row like [-inf, 1] (softmax.cuh: Online, merge, block_merge).
          Backward: step 3's kernel (shared from softmax.cuh): its one pass for the dot is
          already minimal for a two-walk backward (2 + 2 reads + 1 write).
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

namespace sm = rosetta::softmax;

cudaError_t softmax_04_online(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    sm::launch_online(a.x.ptr<const T>(), a.x.stride[0], a.out.ptr<T>(), rows, cols, stream);
  });
}

cudaError_t softmax_04_online_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  return rosetta::dispatch_dtype(a.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    sm::launch_dot_backward(a.y.ptr<const T>(), a.y.stride[0], a.dy.ptr<const T>(), a.dy.stride[0],
                            a.dx.ptr<T>(), rows, cols, stream);
  });
}
