/*
Step 2 — online softmax: S stays on chip (FlashAttention's idea on CUDA cores)
Changed:  one kernel, a 256-thread block per 64 queries of one head: q's tile sits in shared
          memory (fp32, pre-multiplied by scale log2 e), k's and v's 64-key tiles pass through
          it; each thread computes 4 x 4 scores with fp32 FMAs, keeps its 4 rows' running max and
          sum and a 4 x D/16 accumulator in registers, rescaled by exp2(m_old - m_new) when the
          max grows. S is never written; out and lse are written once. Causal: key tiles past the
          block's last query are not visited. Backward (FA2 on CUDA cores): the delta kernel, a
          block per 64 keys accumulating dk and dv over the query tiles in registers (P recomputed
          from lse), a block per 64 queries accumulating dq over the key tiles: no atomics, the
          same bits every run.
Why:      B=4, H=16, S=4096, D=128: step 1 moves ~21 GB of S; here the traffic is q, out once and
          k, v once per 64-query block: 64 heads x 64 blocks x 2 MB = 8.6 GB, mostly from L2 (a
          head's k and v are 2 MB, shared by its 64 blocks), 268 MB from DRAM. What is left is
          the 550 GFLOP on CUDA cores: 2 LDS.128 per 16 FFMA in the score loop, 3 per 32 in P v.
Still:    fp32 FMAs: 67 TFLOP/s at best on an H100, ~15x below its bf16 tensor cores; the loads
          of a tile wait for the barrier (nothing overlaps them but other resident blocks: 2 per
          SM forward, 1 backward: ~170-210 registers). Step 3 moves the products to mma.sync.
Limits:   none within the spec. Shared memory (dynamic): forward 85 KB (D=128) / 52 KB (D=64);
          backward 170 / 104 KB (dk, dv) and 153 / 87 KB (dq). Workspace: B H Sq fp32 (delta).
Dtypes:   bfloat16, float16
Layout:   rows
*/
#include "attention.cuh"

namespace {

namespace attn = rosetta::attn;
using attn::Heads;
using rosetta::from_float;
using rosetta::to_float;

constexpr int kBM = 64, kBN = 64;  // queries, keys per tile
constexpr int kThreads = 256;      // 16 x 16: thread (ty, tx) owns rows ty*4..ty*4+3 and keys tx + 16 c
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
// Tile rows of D floats padded to D + 4: the row pitch in 16-byte units (D / 4 + 1) is odd, so 8
// threads reading a float4 each from 8 consecutive rows hit 8 different bank groups.
template <int kD> constexpr int kPitch = kD + 4;
constexpr int kPPitch = kBM + 4;  // P^T / dS^T tiles: [64][68], written a float4 (4 rows) at a time

// rows [0, 64) of a tile from `src` (row stride `ld`) into shared fp32 [64][kD + 4], times `mul`;
// rows >= valid read as zero. vec: 16-byte loads (the host checked base and strides).
template <typename T, int kD>
__device__ __forceinline__ void load_tile(float* dst, const T* __restrict__ src, int64_t ld, int valid, float mul,
                                          bool vec) {
  constexpr int kChunks = kD / 8;  // 8 elements, 16 bytes, a chunk
  static_assert(kBM * kChunks % kThreads == 0, "whole passes");
#pragma unroll
  for (int pass = 0; pass < kBM * kChunks / kThreads; ++pass) {
    const int idx = pass * kThreads + threadIdx.x, r = idx / kChunks, c = idx % kChunks * 8;
    float v[8];
    if (r < valid) {
      const T* p = src + r * ld + c;
      if (vec) {
        rosetta::Vec16<T> raw;
        raw.raw = *reinterpret_cast<const uint4*>(p);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = raw.get(e) * mul;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = to_float(p[e]) * mul;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;  // past the sequence: zeros, masked later
    }
    float4* d = reinterpret_cast<float4*>(dst + r * kPitch<kD> + c);
    d[0] = make_float4(v[0], v[1], v[2], v[3]);
    d[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
}
// Reductions over the 16 threads of a row (tx = lane % 16: lanes 0-15 and 16-31 are two rows groups).
__device__ __forceinline__ float row_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// acc[i][c] += a-rows (4 rows ty*4 + i of `a`) . b-rows (rows tx + 16 c of `b`), over kD.
template <int kD, int kUnroll>
__device__ __forceinline__ void dot_tile(float (&acc)[4][4], const float* a, const float* b, int ty, int tx) {
#pragma unroll kUnroll
  for (int d = 0; d < kD; d += 4) {
    float4 av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = lds4(a + (ty * 4 + i) * kPitch<kD> + d);
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = lds4(b + (tx + 16 * c) * kPitch<kD> + d);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = dot4(av[i], bv[c], acc[i][c]);
  }
}

// acc[i][cc * 4 + e] += sum_j w[j][ty*4 + i] x[j][tx*4 + 64 cc + e]: the weights transposed in
// shared memory ([64][68], 4 rows a float4), the values rows of D (columns tx*4 + 64 cc ...).
template <int kD>
__device__ __forceinline__ void weigh_rows(float (&acc)[4][kD / 16], const float* w, const float* x, int ty, int tx) {
#pragma unroll 2
  for (int j = 0; j < 64; ++j) {
    const float4 wv = lds4(w + j * kPPitch + ty * 4);
    const float wr[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int cc = 0; cc < kD / 64; ++cc) {
      const float4 xv = lds4(x + j * kPitch<kD> + tx * 4 + 64 * cc);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[i][cc * 4 + 0] = fmaf(wr[i], xv.x, acc[i][cc * 4 + 0]);
        acc[i][cc * 4 + 1] = fmaf(wr[i], xv.y, acc[i][cc * 4 + 1]);
        acc[i][cc * 4 + 2] = fmaf(wr[i], xv.z, acc[i][cc * 4 + 2]);
        acc[i][cc * 4 + 3] = fmaf(wr[i], xv.w, acc[i][cc * 4 + 3]);
      }
    }
  }
}

// Column j's 4 values (rows ty*4 .. ty*4+3) as one float4 of the transposed tile: 8 threads of a
// quarter warp write 8 consecutive rows j, 17 units apart: 8 bank groups.
__device__ __forceinline__ void store_column(float* w, int j, int ty, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(w + j * kPPitch + ty * 4) = make_float4(a, b, c, d);
}

// Rows ty*4 + i (< valid) of a 64 x kD register tile to dst (row stride ld), columns tx*4 + 64 cc + e.
template <typename T, int kD>
__device__ __forceinline__ void store_rows(T* dst, int64_t ld, int valid, const float (&acc)[4][kD / 16], float mul,
                                           int ty, int tx, int i) {
  if (ty * 4 + i >= valid) return;
  T* p = dst + (ty * 4 + i) * ld;
#pragma unroll
  for (int cc = 0; cc < kD / 64; ++cc)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[tx * 4 + 64 * cc + e] = from_float<T>(acc[i][cc * 4 + e] * mul);
}

template <int kD> constexpr int kForwardSmem = (2 * 64 * kPitch<kD> + 64 * kPPitch) * 4;

// Block: queries q0 .. q0 + 63 of head bh; the longest causal rows (the last blocks) go first.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 2)
attention_forward(Heads<const T> q, Heads<const T> k, Heads<const T> v, Heads<T> out, Heads<float> lse, int64_t seq_q,
                  int64_t seq_k, int64_t q_blocks, bool causal, float scale_log2, bool vec) {
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;                     // [64][kD + 4]  q * scale * log2(e)
  float* kv = qs + 64 * kPitch<kD>;     // [64][kD + 4]  k, then v, of the current key tile
  float* ps = kv + 64 * kPitch<kD>;     // [64 keys][68] P^T of the tile
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t bh = blockIdx.x / q_blocks, q0 = (q_blocks - 1 - blockIdx.x % q_blocks) * kBM;
  const int q_valid = int(std::min<int64_t>(kBM, seq_q - q0));
  load_tile<T, kD>(qs, q.row(bh, q0), q.row_stride, q_valid, scale_log2, vec);
  // Causal: the block's last query sees keys < q0 + q_valid; later tiles are all masked.
  const int64_t kv_end = causal ? std::min(seq_k, q0 + q_valid) : seq_k;

  float o[4][kD / 16] = {};
  float m[4], l[4];  // running max (log2 units) and this thread's part of the running sum, per row
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = -INFINITY, l[i] = 0.0f;

  for (int64_t j0 = 0; j0 < kv_end; j0 += kBN) {
    const int kv_valid = int(std::min<int64_t>(kBN, seq_k - j0));
    __syncthreads();  // the previous tile's P v is done with kv and ps
    load_tile<T, kD>(kv, k.row(bh, j0), k.row_stride, kv_valid, 1.0f, vec);
    __syncthreads();  // k (and, the first time, q) in place
    float s[4][4] = {};
    dot_tile<kD, 1>(s, qs, kv, ty, tx);  // 1: the forward keeps o live (2 blocks an SM: <= 128 registers)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = q0 + ty * 4 + i;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t key = j0 + tx + 16 * c;
        if (key >= seq_k || attn::masked(row, key, causal)) s[i][c] = -INFINITY;
        mx = fmaxf(mx, s[i][c]);
      }
      const float m_new = fmaxf(m[i], row_max(mx));
      // A row that has seen only masked keys so far (never after tile 0, which holds key 0;
      // kept for safety): subtract 0, not -inf, so exp2 gives 0 rather than NaN.
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m[i] - m_use);  // 0 the first time (m = -inf)
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) sum += (s[i][c] = exp2f(s[i][c] - m_use));
      l[i] = l[i] * alpha + sum;
#pragma unroll
      for (int e = 0; e < kD / 16; ++e) o[i][e] *= alpha;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) store_column(ps, tx + 16 * c, ty, s[0][c], s[1][c], s[2][c], s[3][c]);
    __syncthreads();  // every thread is done reading k: v may overwrite it
    // (v is loaded after the scores are in ps: no score registers are live across its loads)
    load_tile<T, kD>(kv, v.row(bh, j0), v.row_stride, kv_valid, 1.0f, vec);
    __syncthreads();  // P and v in place
    weigh_rows<kD>(o, ps, kv, ty, tx);
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float total = row_sum(l[i]);  // every lane: the shuffles need the whole warp
    store_rows<T, kD>(out.row(bh, q0), out.row_stride, q_valid, o, 1.0f / total, ty, tx, i);
    if (tx == 0 && ty * 4 + i < q_valid) *lse.row(bh, q0 + ty * 4 + i) = (m[i] + log2f(total)) * kLn2;
  }
}

// ------------------------------------------------------------------------------------------------
// Backward. P = exp2(scale log2(e) q.k - lse log2(e)), dS = P (dP - delta) scale.

template <int kD> constexpr int kKeySmem = (4 * 64 * kPitch<kD> + 2 * 64 * kPPitch) * 4;
template <int kD> constexpr int kQuerySmem = (4 * 64 * kPitch<kD> + 64 * kPPitch) * 4;

// Block: keys k0 .. k0 + 63 of head bh, k and v resident; for every query tile that can see them,
// thread (ty, tx) computes P^T and dS^T for keys ty*4 + i and queries tx + 16 c, stores them
// transposed (query-major), and adds P^T dout and dS^T q into its dv, dk rows.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
attention_backward_kv(Heads<const T> q, Heads<const T> k, Heads<const T> v, Heads<const T> dout,
                      Heads<const float> lse, const float* __restrict__ delta, Heads<T> dk, Heads<T> dv,
                      int64_t seq_q, int64_t seq_k, int64_t k_blocks, bool causal, float scale, bool vec) {
  extern __shared__ __align__(16) float smem[];
  float* ks = smem;                   // [64][kD + 4] resident
  float* vs = ks + 64 * kPitch<kD>;   // [64][kD + 4] resident
  float* qs = vs + 64 * kPitch<kD>;   // [64][kD + 4] this query tile
  float* dos = qs + 64 * kPitch<kD>;  // [64][kD + 4]
  float* ps = dos + 64 * kPitch<kD>;  // [64 queries][68] P of (query, key ty*4 ..)
  float* ds = ps + 64 * kPPitch;      // [64 queries][68] dS
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t bh = blockIdx.x / k_blocks, k0 = (blockIdx.x % k_blocks) * kBN;
  const int k_valid = int(std::min<int64_t>(kBN, seq_k - k0));
  const float scale_log2 = scale * kLog2e;
  load_tile<T, kD>(ks, k.row(bh, k0), k.row_stride, k_valid, 1.0f, vec);
  load_tile<T, kD>(vs, v.row(bh, k0), v.row_stride, k_valid, 1.0f, vec);

  float dk_acc[4][kD / 16] = {}, dv_acc[4][kD / 16] = {};
  // Causal: queries before k0 see none of these keys (kBM == kBN: k0 starts a query tile).
  static_assert(kBM == kBN, "the first query tile starts at k0");
  for (int64_t i0 = causal ? k0 : 0; i0 < seq_q; i0 += kBM) {
    const int q_valid = int(std::min<int64_t>(kBM, seq_q - i0));
    __syncthreads();  // the previous tile's products are done with qs, dos, ps, ds
    load_tile<T, kD>(qs, q.row(bh, i0), q.row_stride, q_valid, 1.0f, vec);
    load_tile<T, kD>(dos, dout.row(bh, i0), dout.row_stride, q_valid, 1.0f, vec);
    float lse2[4], dl[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t qi = i0 + tx + 16 * c;
      lse2[c] = qi < seq_q ? *lse.row(bh, qi) * kLog2e : 0.0f;
      dl[c] = qi < seq_q ? delta[bh * seq_q + qi] : 0.0f;
    }
    __syncthreads();  // the query tile in place (and, the first time, k and v)
    float p[4][4] = {}, dp[4][4] = {};  // [key i][query c]
    dot_tile<kD, 2>(p, ks, qs, ty, tx);
    dot_tile<kD, 2>(dp, vs, dos, ty, tx);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t key = k0 + ty * 4 + i;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t qi = i0 + tx + 16 * c;
        const bool off = qi >= seq_q || key >= seq_k || attn::masked(qi, key, causal);
        p[i][c] = off ? 0.0f : exp2f(fmaf(p[i][c], scale_log2, -lse2[c]));
        dp[i][c] = p[i][c] * (dp[i][c] - dl[c]) * scale;  // dS
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      store_column(ps, tx + 16 * c, ty, p[0][c], p[1][c], p[2][c], p[3][c]);
      store_column(ds, tx + 16 * c, ty, dp[0][c], dp[1][c], dp[2][c], dp[3][c]);
    }
    __syncthreads();  // P and dS of the whole tile in place
    weigh_rows<kD>(dv_acc, ps, dos, ty, tx);  // dv += P^T dout
    weigh_rows<kD>(dk_acc, ds, qs, ty, tx);   // dk += dS^T q
  }
  // Keys no query sees (causal, Sk > Sq) leave the loop untouched: their zeros are stored.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    store_rows<T, kD>(dk.row(bh, k0), dk.row_stride, k_valid, dk_acc, 1.0f, ty, tx, i);
    store_rows<T, kD>(dv.row(bh, k0), dv.row_stride, k_valid, dv_acc, 1.0f, ty, tx, i);
  }
}

// Block: queries q0 .. q0 + 63 of head bh, q and dout resident; over the key tiles it can see,
// dS for (row ty*4 + i, key tx + 16 c), stored key-major, then dq += dS k.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
attention_backward_q(Heads<const T> q, Heads<const T> k, Heads<const T> v, Heads<const T> dout,
                     Heads<const float> lse, const float* __restrict__ delta, Heads<T> dq, int64_t seq_q,
                     int64_t seq_k, int64_t q_blocks, bool causal, float scale, bool vec) {
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;                   // [64][kD + 4] resident
  float* dos = qs + 64 * kPitch<kD>;  // [64][kD + 4] resident
  float* ks = dos + 64 * kPitch<kD>;  // [64][kD + 4] this key tile
  float* vs = ks + 64 * kPitch<kD>;   // [64][kD + 4]
  float* ds = vs + 64 * kPitch<kD>;   // [64 keys][68] dS^T
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t bh = blockIdx.x / q_blocks, q0 = (q_blocks - 1 - blockIdx.x % q_blocks) * kBM;
  const int q_valid = int(std::min<int64_t>(kBM, seq_q - q0));
  const float scale_log2 = scale * kLog2e;
  load_tile<T, kD>(qs, q.row(bh, q0), q.row_stride, q_valid, 1.0f, vec);
  load_tile<T, kD>(dos, dout.row(bh, q0), dout.row_stride, q_valid, 1.0f, vec);
  float lse2[4], dl[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = q0 + ty * 4 + i;
    lse2[i] = row < seq_q ? *lse.row(bh, row) * kLog2e : 0.0f;
    dl[i] = row < seq_q ? delta[bh * seq_q + row] : 0.0f;
  }
  const int64_t kv_end = causal ? std::min(seq_k, q0 + q_valid) : seq_k;

  float dq_acc[4][kD / 16] = {};
  for (int64_t j0 = 0; j0 < kv_end; j0 += kBN) {
    const int kv_valid = int(std::min<int64_t>(kBN, seq_k - j0));
    __syncthreads();  // the previous tile's dS k is done with ks and ds
    load_tile<T, kD>(ks, k.row(bh, j0), k.row_stride, kv_valid, 1.0f, vec);
    load_tile<T, kD>(vs, v.row(bh, j0), v.row_stride, kv_valid, 1.0f, vec);
    __syncthreads();  // the key tile in place (and, the first time, q and dout)
    float p[4][4] = {}, dp[4][4] = {};  // [row i][key c]
    dot_tile<kD, 2>(p, qs, ks, ty, tx);
    dot_tile<kD, 2>(dp, dos, vs, ty, tx);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = q0 + ty * 4 + i;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t key = j0 + tx + 16 * c;
        const bool off = row >= seq_q || key >= seq_k || attn::masked(row, key, causal);
        const float pv = off ? 0.0f : exp2f(fmaf(p[i][c], scale_log2, -lse2[i]));
        dp[i][c] = pv * (dp[i][c] - dl[i]) * scale;
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) store_column(ds, tx + 16 * c, ty, dp[0][c], dp[1][c], dp[2][c], dp[3][c]);
    __syncthreads();  // dS of the whole tile in place
    weigh_rows<kD>(dq_acc, ds, ks, ty, tx);  // dq += dS k
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) store_rows<T, kD>(dq.row(bh, q0), dq.row_stride, q_valid, dq_acc, 1.0f, ty, tx, i);
}

// Opts the kernel in to `bytes` of dynamic shared memory, then launches it on `blocks` blocks.
template <typename Kernel, typename... Args>
cudaError_t launch(Kernel kernel, int64_t blocks, int bytes, cudaStream_t stream, Args... args) {
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status != cudaSuccess) return status;
  kernel<<<unsigned(blocks), kThreads, bytes, stream>>>(args...);
  return cudaGetLastError();
}

// Calls f(std::integral_constant<int, D>) for head_dim 64 or 128; false for any other.
template <typename F> bool by_head_dim(int64_t d, F&& f) {
  if (d == 64) return f(std::integral_constant<int, 64>{}), true;
  if (d == 128) return f(std::integral_constant<int, 128>{}), true;
  return false;
}

}  // namespace

cudaError_t attention_02_online_softmax(const rosetta::AttentionArgs& a, cudaStream_t stream) {
  const int64_t bh = a.q.size[0] * a.q.size[1], seq_q = a.q.size[2], seq_k = a.k.size[2];
  if (a.q.size[3] != 64 && a.q.size[3] != 128) return cudaErrorInvalidValue;  // the spec's head dims
  if (bh == 0 || seq_q == 0) return cudaSuccess;
  const bool vec = attn::aligned_heads(a.q, 8) && attn::aligned_heads(a.k, 8) && attn::aligned_heads(a.v, 8);
  const int64_t q_blocks = rosetta::ceil_div(seq_q, kBM);
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    by_head_dim(a.q.size[3], [&](auto dim) {
      constexpr int kD = decltype(dim)::value;
      status = launch(attention_forward<T, kD>, q_blocks * bh, kForwardSmem<kD>, stream, attn::heads<const T>(a.q),
                      attn::heads<const T>(a.k), attn::heads<const T>(a.v), attn::heads<T>(a.out),
                      attn::heads<float>(a.lse), seq_q, seq_k, q_blocks, a.causal != 0,
                      float(a.scale) * kLog2e, vec);
    });
  });
  return status != cudaSuccess ? status : launched;
}

cudaError_t attention_02_online_softmax_backward(const rosetta::AttentionBackwardArgs& a, cudaStream_t stream) {
  const int64_t bh = a.q.size[0] * a.q.size[1], seq_q = a.q.size[2], seq_k = a.k.size[2], dim = a.q.size[3];
  if (dim != 64 && dim != 128) return cudaErrorInvalidValue;
  if (bh == 0) return cudaSuccess;
  const bool causal = a.causal != 0;
  const float scale = float(a.scale);
  const bool vec = attn::aligned_heads(a.q, 8) && attn::aligned_heads(a.k, 8) && attn::aligned_heads(a.v, 8) &&
                   attn::aligned_heads(a.dout, 8);
  float* delta = seq_q == 0 ? nullptr : a.workspace.get<float>(bh * seq_q);
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (seq_q == 0) {  // no queries: dk and dv are sums over nothing
      attn::zero_heads<T>(a.dk, bh, seq_k, int(dim), stream);
      attn::zero_heads<T>(a.dv, bh, seq_k, int(dim), stream);
      return;
    }
    by_head_dim(dim, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      const auto q = attn::heads<const T>(a.q), k = attn::heads<const T>(a.k), v = attn::heads<const T>(a.v);
      const auto dout = attn::heads<const T>(a.dout);
      const auto lse = attn::heads<const float>(a.lse);
      attn::delta_rows<T><<<attn::delta_grid(bh * seq_q), attn::kDeltaThreads, 0, stream>>>(
          attn::heads<const T>(a.out), dout, delta, bh, seq_q, kD);
      const int64_t k_blocks = rosetta::ceil_div(seq_k, kBN), q_blocks = rosetta::ceil_div(seq_q, kBM);
      status = launch(attention_backward_kv<T, kD>, k_blocks * bh, kKeySmem<kD>, stream, q, k, v, dout, lse,
                      static_cast<const float*>(delta), attn::heads<T>(a.dk), attn::heads<T>(a.dv), seq_q, seq_k,
                      k_blocks, causal, scale, vec);
      if (status != cudaSuccess) return;
      status = launch(attention_backward_q<T, kD>, q_blocks * bh, kQuerySmem<kD>, stream, q, k, v, dout, lse,
                      static_cast<const float*>(delta), attn::heads<T>(a.dq), seq_q, seq_k, q_blocks, causal,
                      scale, vec);
    });
  });
  return status != cudaSuccess ? status : launched;
}
