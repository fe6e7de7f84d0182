/*
Step 1 — the formula: S materialized, three kernels
Changed:  the formula as written, a kernel per line: S = scale q k^T into an fp32 workspace (a
          64 x 64-tile shared-memory GEMM on CUDA cores, 4 x 4 sums a thread), a block per row
          softmaxes S in place (max, sum of exp, then P = exp(s - lse); writes lse), and
          out = P v (the same GEMM). Heads go through in chunks that keep S <= 256 MB (a head
          longer than that, in chunks of query rows: rows of S are independent). Backward the
          same way: S and dP = dout v^T into the workspace, a row kernel turns them into P and
          dS = P (dP - delta) scale, then dq = dS k, dv = P^T dout, dk = dS^T q as GEMMs
          (over several query chunks dk and dv add up in fp32 workspace rows).
Why:      the baseline: B=4, H=16, S=4096, D=128 has 64 heads of 4096^2 scores, 1.07 G fp32 =
          4.3 GB of S, written by the GEMM, read and written by the softmax, read twice by P v
          (D = 128 is two 64-column tiles): ~21 GB of traffic (~6 ms at 3.35 TB/s) for 268 MB
          of q, k, v and out, beside 550 GFLOP (4 B H S^2 D) on CUDA cores. The backward
          writes S and dP, rewrites them as P and dS, and reads them for three GEMMs: ~50 GB.
Still:    S crosses DRAM ~5 times (forward) though it need never leave the SM, and causal
          computes every masked score too. Step 2 keeps a tile of S on chip (online softmax).
Limits:   none within the spec; workspace <= 256 MB for S (forward), 2 x 128 MB for S and dP
          (backward) plus B H Sq fp32 (delta) and, past one query chunk, 2 Sk D fp32.
Dtypes:   bfloat16, float16
Layout:   rows
*/
#include "attention.cuh"

namespace {

namespace attn = rosetta::attn;
using attn::Heads;
using rosetta::to_float;
using rosetta::from_float;

// An operand of the batched GEMM: element (x, k) of batch z at head(first + z) + x * x_stride +
// k * k_stride, x being m (for A and C) or n (for B). The same q serves as A (x = query, k = d)
// and, with its strides swapped, as B (k = query, x = d).
template <typename T>
struct Operand {
  Heads<T> h;
  int64_t first;  // the head (bh) of batch 0 of this launch
  int64_t x_stride, k_stride;
  __device__ __forceinline__ T* at(int z) const { return h.head(first + z); }
};

// A tensor's rows [r0, ...) as x, d as k (q as A; k^T as B of S = q k^T; C = out, dq, dk, dv).
template <typename T>
Operand<T> by_rows(const rosetta::Tensor& t, int64_t h0, int64_t r0) {
  Heads<T> h = attn::heads<T>(t);
  h.data += r0 * h.row_stride;
  return {h, h0, h.row_stride, 1};
}
// The same rows as k, d as x (v as B of P v; dout, q, k as B of the gradients).
template <typename T>
Operand<T> by_cols(const rosetta::Tensor& t, int64_t h0, int64_t r0) {
  Operand<T> o = by_rows<T>(t, h0, r0);
  o.x_stride = 1;
  o.k_stride = o.h.row_stride;
  return o;
}
// A workspace of `per_head` floats a batch, rows of `cols`: as rows (S as A or C) or transposed (P^T).
// (INT64_MAX heads: bh / heads = 0, bh % heads = bh, so batch z sits z * per_head floats in.)
template <typename F = float>
Operand<F> ws_rows(F* p, int64_t per_head, int64_t cols) {
  return {Heads<F>{p, INT64_MAX, 0, per_head, cols}, 0, cols, 1};
}
template <typename F = const float>
Operand<F> ws_cols(F* p, int64_t per_head, int64_t cols) {
  return {Heads<F>{p, INT64_MAX, 0, per_head, cols}, 0, 1, cols};
}

constexpr int kTile = 64, kBK = 16, kThreads = 256;  // 16 x 16 threads, 4 x 4 sums each
static_assert(kTile * kBK == 4 * kThreads, "each thread loads 4 elements of each operand tile");

// C[z] = alpha A[z] B[z] (+ C[z] if kAccumulate), A: M x K, B: K x N, fp32 sums. kAk / kBk: the
// operand's k stride is 1, so the loading threads walk k (coalesced); otherwise they walk m / n.
// The tiles are stored k-major in shared memory: a thread reads 4 m (4 n) of one k as a float4.
template <typename TA, bool kAk, typename TB, bool kBk, typename TC, bool kAccumulate>
__global__ void __launch_bounds__(kThreads)
gemm(Operand<const TA> a, Operand<const TB> b, Operand<TC> c, int M, int N, int K, float alpha, int tiles_n) {
  __shared__ __align__(16) float as[kBK][kTile + 4];
  __shared__ __align__(16) float bs[kBK][kTile + 4];
  const int t = threadIdx.x, ty = t / 16, tx = t % 16;
  const int m0 = int(blockIdx.x) / tiles_n * kTile, n0 = int(blockIdx.x) % tiles_n * kTile;
  const TA* pa = a.at(blockIdx.y);
  const TB* pb = b.at(blockIdx.y);
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kBK) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int am = kAk ? t / kBK + 16 * p : t % kTile, ak = kAk ? t % kBK : t / kTile + 4 * p;
      const int bn = kBk ? t / kBK + 16 * p : t % kTile, bk = kBk ? t % kBK : t / kTile + 4 * p;
      const int m = m0 + am, n = n0 + bn, ka = k0 + ak, kb = k0 + bk;
      as[ak][am] = m < M && ka < K ? to_float(pa[m * a.x_stride + ka * a.k_stride]) : 0.0f;  // zero-filled edges
      bs[bk][bn] = n < N && kb < K ? to_float(pb[n * b.x_stride + kb * b.k_stride]) : 0.0f;
    }
    __syncthreads();  // the tiles are complete
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      const float4 av = *reinterpret_cast<const float4*>(&as[k][ty * 4]);
      const float4 bv = *reinterpret_cast<const float4*>(&bs[k][tx * 4]);
      const float ar[4] = {av.x, av.y, av.z, av.w}, br[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
    }
    __syncthreads();  // every thread is done with the tiles before the next ones overwrite them
  }
  TC* pc = c.at(blockIdx.y);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty * 4 + i;
    if (m >= M) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx * 4 + j;
      if (n >= N) break;
      TC* dst = pc + m * c.x_stride + n * c.k_stride;
      float v = alpha * acc[i][j];
      if constexpr (kAccumulate) v += to_float(*dst);
      *dst = from_float<TC>(v);
    }
  }
}

template <typename TA, bool kAk, typename TB, bool kBk, typename TC, bool kAccumulate = false>
void launch_gemm(Operand<const TA> a, Operand<const TB> b, Operand<TC> c, int64_t M, int64_t N, int64_t K,
                 float alpha, int batches, cudaStream_t stream) {
  const int tiles_n = int(rosetta::ceil_div(N, kTile));
  const dim3 grid(unsigned(rosetta::ceil_div(M, kTile) * tiles_n), unsigned(batches));
  gemm<TA, kAk, TB, kBk, TC, kAccumulate><<<grid, kThreads, 0, stream>>>(a, b, c, int(M), int(N), int(K), alpha, tiles_n);
}

constexpr int kRowThreads = 256;

// Block per row of S (batch z = row / rows, query r0 + row % rows): max, sum of exp, lse, then
// P = exp(s - lse) in place over the keys the query sees and 0 over the masked ones (P v reads them).
__global__ void __launch_bounds__(kRowThreads)
softmax_rows(float* __restrict__ S, int64_t seq_k, int64_t rows, int64_t r0, Heads<float> lse, int64_t h0,
             bool causal) {
  __shared__ float scratch[kRowThreads / 32];
  const int64_t row = blockIdx.x, z = row / rows, qi = r0 + row % rows;
  float* s = S + row * seq_k;
  const int64_t n = attn::keys_seen(qi, seq_k, causal);  // >= 1: key 0 is never masked
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kRowThreads) m = fmaxf(m, s[j]);
  m = rosetta::block_reduce<kRowThreads, rosetta::Max>(m, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kRowThreads) sum += expf(s[j] - m);
  sum = rosetta::block_reduce<kRowThreads, rosetta::Sum>(sum, scratch);
  const float l = m + logf(sum);
  for (int64_t j = threadIdx.x; j < seq_k; j += kRowThreads) s[j] = j < n ? expf(s[j] - l) : 0.0f;
  if (threadIdx.x == 0) *lse.row(h0 + z, qi) = l;
}

// Backward, block per row: S -> P = exp(s - lse) (0 where masked), dP -> dS = P (dP - delta) scale.
__global__ void __launch_bounds__(kRowThreads)
grad_rows(float* __restrict__ S, float* __restrict__ dP, int64_t seq_k, int64_t rows, int64_t r0,
          Heads<const float> lse, const float* __restrict__ delta, int64_t seq_q, int64_t h0, bool causal,
          float scale) {
  const int64_t row = blockIdx.x, bh = h0 + row / rows, qi = r0 + row % rows;
  float* s = S + row * seq_k;
  float* dp = dP + row * seq_k;
  const int64_t n = attn::keys_seen(qi, seq_k, causal);
  const float l = *lse.row(bh, qi), d = delta[bh * seq_q + qi];
  for (int64_t j = threadIdx.x; j < seq_k; j += kRowThreads) {
    const float p = j < n ? expf(s[j] - l) : 0.0f;
    s[j] = p;
    dp[j] = p * (dp[j] - d) * scale;
  }
}

// fp32 sums of dk or dv (batch z's Sk x D rows in the workspace) -> the gradient's dtype.
template <typename T>
__global__ void __launch_bounds__(256)
store_rows(const float* __restrict__ src, Heads<T> dst, int64_t h0, int64_t batches, int64_t rows, int64_t cols) {
  const int64_t n = batches * rows * cols;
  for (int64_t e = int64_t(blockIdx.x) * 256 + threadIdx.x; e < n; e += int64_t(gridDim.x) * 256) {
    const int64_t r = e / cols;
    dst.row(h0 + r / rows, r % rows)[e % cols] = from_float<T>(src[e]);
  }
}

// Heads a launch covers and query rows per head, so that `budget` fp32 scores (a workspace
// matrix) hold heads x rows x Sk: whole heads while one fits, else one head in query chunks.
struct Plan {
  int64_t heads, rows;
};
Plan plan(int64_t bh, int64_t seq_q, int64_t seq_k, int64_t budget) {
  if (seq_q * seq_k <= budget) return {std::min({bh, budget / (seq_q * seq_k), int64_t(65535)}), seq_q};
  return {1, std::max<int64_t>(1, budget / seq_k)};  // grid.y <= 65535 above
}

constexpr int64_t kScores = int64_t(1) << 26;  // 256 MB of fp32 S

}  // namespace

cudaError_t attention_01_three_kernels(const rosetta::AttentionArgs& a, cudaStream_t stream) {
  const int64_t bh = a.q.size[0] * a.q.size[1], seq_q = a.q.size[2], seq_k = a.k.size[2], dim = a.q.size[3];
  if (bh == 0 || seq_q == 0) return cudaSuccess;
  const Plan p = plan(bh, seq_q, seq_k, kScores);
  float* S = a.workspace.get<float>(p.heads * p.rows * seq_k);
  const bool causal = a.causal != 0;
  return rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t h0 = 0; h0 < bh; h0 += p.heads) {
      const int nz = int(std::min(p.heads, bh - h0));
      for (int64_t r0 = 0; r0 < seq_q; r0 += p.rows) {
        const int64_t nr = std::min(p.rows, seq_q - r0), per_head = nr * seq_k;
        launch_gemm<T, true, T, true, float>(by_rows<const T>(a.q, h0, r0), by_rows<const T>(a.k, h0, 0),
                                             ws_rows(S, per_head, seq_k), nr, seq_k, dim, float(a.scale), nz, stream);
        softmax_rows<<<unsigned(nz * nr), kRowThreads, 0, stream>>>(S, seq_k, nr, r0, attn::heads<float>(a.lse), h0,
                                                                    causal);
        launch_gemm<float, true, T, false, T>(ws_rows<const float>(S, per_head, seq_k), by_cols<const T>(a.v, h0, 0),
                                              by_rows<T>(a.out, h0, r0), nr, dim, seq_k, 1.0f, nz, stream);
      }
    }
  });
}

cudaError_t attention_01_three_kernels_backward(const rosetta::AttentionBackwardArgs& a, cudaStream_t stream) {
  const int64_t bh = a.q.size[0] * a.q.size[1], seq_q = a.q.size[2], seq_k = a.k.size[2], dim = a.q.size[3];
  if (bh == 0) return cudaSuccess;
  const bool causal = a.causal != 0;
  const float scale = float(a.scale);
  if (seq_q == 0) {  // no queries: dk and dv are sums over nothing
    return rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
      using T = decltype(tag);
      attn::zero_heads<T>(a.dk, bh, seq_k, int(dim), stream);
      attn::zero_heads<T>(a.dv, bh, seq_k, int(dim), stream);
    });
  }
  const Plan p = plan(bh, seq_q, seq_k, kScores / 2);  // two matrices: S (then P) and dP (then dS)
  const bool whole = p.rows == seq_q;                 // one query chunk: dk and dv in one GEMM each
  float* delta = a.workspace.get<float>(bh * seq_q);
  float* S = a.workspace.get<float>(p.heads * p.rows * seq_k);
  float* dP = a.workspace.get<float>(p.heads * p.rows * seq_k);
  float* dk_sum = whole ? nullptr : a.workspace.get<float>(seq_k * dim);  // p.heads == 1 here
  float* dv_sum = whole ? nullptr : a.workspace.get<float>(seq_k * dim);
  return rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    attn::delta_rows<T><<<attn::delta_grid(bh * seq_q), attn::kDeltaThreads, 0, stream>>>(
        attn::heads<const T>(a.out), attn::heads<const T>(a.dout), delta, bh, seq_q, int(dim));
    for (int64_t h0 = 0; h0 < bh; h0 += p.heads) {
      const int nz = int(std::min(p.heads, bh - h0));
      for (int64_t r0 = 0; r0 < seq_q; r0 += p.rows) {
        const int64_t nr = std::min(p.rows, seq_q - r0), per_head = nr * seq_k;
        const auto q_rows = by_rows<const T>(a.q, h0, r0), do_rows = by_rows<const T>(a.dout, h0, r0);
        launch_gemm<T, true, T, true, float>(q_rows, by_rows<const T>(a.k, h0, 0), ws_rows(S, per_head, seq_k), nr,
                                             seq_k, dim, scale, nz, stream);
        launch_gemm<T, true, T, true, float>(do_rows, by_rows<const T>(a.v, h0, 0), ws_rows(dP, per_head, seq_k),
                                             nr, seq_k, dim, 1.0f, nz, stream);
        grad_rows<<<unsigned(nz * nr), kRowThreads, 0, stream>>>(S, dP, seq_k, nr, r0, attn::heads<const float>(a.lse),
                                                                 delta, seq_q, h0, causal, scale);
        // dq = dS k: every key is in this chunk, so dq's rows are final.
        launch_gemm<float, true, T, false, T>(ws_rows<const float>(dP, per_head, seq_k), by_cols<const T>(a.k, h0, 0),
                                              by_rows<T>(a.dq, h0, r0), nr, dim, seq_k, 1.0f, nz, stream);
        // dv = P^T dout, dk = dS^T q: sums over queries, so over this chunk's rows only.
        const auto pt = ws_cols<const float>(S, per_head, seq_k), dst = ws_cols<const float>(dP, per_head, seq_k);
        const auto do_cols = by_cols<const T>(a.dout, h0, r0), q_cols = by_cols<const T>(a.q, h0, r0);
        if (whole) {
          launch_gemm<float, false, T, false, T>(pt, do_cols, by_rows<T>(a.dv, h0, 0), seq_k, dim, nr, 1.0f, nz, stream);
          launch_gemm<float, false, T, false, T>(dst, q_cols, by_rows<T>(a.dk, h0, 0), seq_k, dim, nr, 1.0f, nz, stream);
          continue;
        }
        const auto sum_v = ws_rows(dv_sum, seq_k * dim, dim), sum_k = ws_rows(dk_sum, seq_k * dim, dim);
        if (r0 == 0) {  // the first chunk writes the sums, later ones add to them
          launch_gemm<float, false, T, false, float>(pt, do_cols, sum_v, seq_k, dim, nr, 1.0f, nz, stream);
          launch_gemm<float, false, T, false, float>(dst, q_cols, sum_k, seq_k, dim, nr, 1.0f, nz, stream);
        } else {
          launch_gemm<float, false, T, false, float, true>(pt, do_cols, sum_v, seq_k, dim, nr, 1.0f, nz, stream);
          launch_gemm<float, false, T, false, float, true>(dst, q_cols, sum_k, seq_k, dim, nr, 1.0f, nz, stream);
        }
      }
      if (!whole) {
        const unsigned blocks = unsigned(std::min<int64_t>(rosetta::ceil_div(nz * seq_k * dim, 256), 65536));
        store_rows<T><<<blocks, 256, 0, stream>>>(dv_sum, attn::heads<T>(a.dv), h0, nz, seq_k, dim);
        store_rows<T><<<blocks, 256, 0, stream>>>(dk_sum, attn::heads<T>(a.dk), h0, nz, seq_k, dim);
      }
    }
  });
}
