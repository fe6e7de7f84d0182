// FlashAttention-2's backward on mma.sync: attention step 3's backward kernels, in their own header
// so that the step's file reads as its forward:
//   Strides, strides_of, vec_ok        a (B, H, rows, D) tensor's batch / head / row strides and
//                                      whether 16-byte copies may read it
//   backward(args, stream)             delta, dQ and dK/dV kernels (no atomics, deterministic);
//                                      cudaErrorInvalidValue for what they cannot take
// The kernels sit in an unnamed namespace: no kernel symbol is shared across the extension's
// translation units.
#pragma once

#include <climits>
#include <cmath>
#include <type_traits>

#include "attention_mma.cuh"
#include "primitives.cuh"

namespace rosetta::attention_fa2 {
namespace {

namespace am = rosetta::attention_mma;

constexpr int kWarps = 4, kThreads = 32 * kWarps;  // a warp owns 16 rows of its block's tile
constexpr int kBM = 16 * kWarps;                   // 64 queries a dQ block
constexpr int kBN = 64;                            // keys a dK/dV block
constexpr float kLog2e = 1.4426950408889634f;
// dK/dV blocks loop over query tiles of kBMkv: 32 at D = 128 keeps dK + dV (128 fp32 a thread)
// plus S^T and dP^T (16 + 16) under the 255-register limit without spills.
template <int kD> constexpr int kBMkv = kD == 128 ? 32 : 64;
// dQ blocks loop over key tiles of kBNdq, for the same reason (dQ 64 + S 32 + dP 32 spill at 64).
template <int kD> constexpr int kBNdq = kD == 128 ? 32 : 64;

struct Strides {
  int64_t s[3];  // batch, head, row (elements); the last dim is contiguous
  __host__ __device__ int64_t head(int b, int h) const { return b * s[0] + h * s[1]; }
};

inline Strides strides_of(const rosetta::Tensor& t) { return Strides{{t.stride[0], t.stride[1], t.stride[2]}}; }

// 16-byte copies are legal when the base is 16-byte aligned and every row start is a multiple of
// 8 elements away from it (a dim of size 1 never moves off the base).
inline bool vec_ok(const rosetta::Tensor& t) {
  bool ok = rosetta::aligned16(t.data);
  for (int d = 0; d < 3; ++d) ok = ok && (t.size[d] == 1 || t.stride[d] % 8 == 0);
  return ok;
}

template <typename T>
struct Backward {
  const T* q;
  const T* k;
  const T* v;
  const T* out;
  const T* dout;
  const float* lse;
  float* delta;  // (B * H, Sq) contiguous, from the workspace
  T* dq;
  T* dk;
  T* dv;
  Strides qs, ks, vs, os, dos, ls, dqs, dks, dvs;
  int H, Sq, Sk, tiles, causal;
  float scale, scale_log2;
  bool vec_q, vec_k, vec_v, vec_do, vec_dq, vec_dk, vec_dv;
};

// ---------------------------------------------------------------------------------------------
// Backward 1/3: delta_i = sum_d dout_id out_id (fp32), one warp a row.
template <typename T, int kD>
__global__ void __launch_bounds__(256) attention_delta(Backward<T> p, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t bh = row / p.Sq;
  const int i = int(row % p.Sq), b = int(bh / p.H), head = int(bh % p.H);
  const T* o = p.out + p.os.head(b, head) + int64_t(i) * p.os.s[2];
  const T* d = p.dout + p.dos.head(b, head) + int64_t(i) * p.dos.s[2];
  float acc = 0.f;
#pragma unroll
  for (int c = lane; c < kD; c += 32) acc += rosetta::to_float(o[c]) * rosetta::to_float(d[c]);
  acc = rosetta::warp_sum(acc);
  if (lane == 0) p.delta[row] = acc;
}

// Backward 2/3: dK, dV for 64 keys of one (batch, head). Warp w owns keys 16w .. 16w+15 and
// computes the transposed products with its keys as the M side: S^T = K Q^T, P^T =
// exp2(S^T scale log2e - lse log2e) (lse, delta per column: a query), dV += P^T dO,
// dP^T = V dO^T, dS^T = P^T (dP^T - delta) scale, dK += dS^T Q. K and V A fragments come from
// the warp's own rows of the K/V tiles; Q and dO (tiles of kBMkv queries) are B operands: as
// rows of n (ldmatrix) for S^T, dP^T and as rows of k (ldmatrix.trans) for dV, dK. No warp
// needs another's rows: the only barriers are the pipeline's.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_dkdv(Backward<T> p) {
  constexpr int kQ = kBMkv<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* const sK = reinterpret_cast<T*>(smem);  // kBN x kD
  T* const sV = sK + kBN * kD;               // kBN x kD
  T* const sQ = sV + kBN * kD;               // 2 stages of kQ x kD
  T* const sdO = sQ + 2 * kQ * kD;           // 2 stages of kQ x kD
  float* const sLse = reinterpret_cast<float*>(sdO + 2 * kQ * kD);  // 2 x kQ, lse * log2(e)
  float* const sDelta = sLse + 2 * kQ;                               // 2 x kQ
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_tile = int(blockIdx.x % p.tiles);  // low key tiles (causal: the most work) first
  const int bh = int(blockIdx.x / p.tiles), b = bh / p.H, head = bh % p.H;
  const int n0 = n_tile * kBN;
  const T* const q = p.q + p.qs.head(b, head);
  const T* const dout = p.dout + p.dos.head(b, head);
  const float* const lse = p.lse + p.ls.head(b, head);
  const float* const delta = p.delta + int64_t(bh) * p.Sq;

  am::load_tile<kBN, kD, kThreads>(sK, p.k + p.ks.head(b, head), p.ks.s[2], n0, p.Sk, p.vec_k);
  am::load_tile<kBN, kD, kThreads>(sV, p.v + p.vs.head(b, head), p.vs.s[2], n0, p.Sk, p.vec_v);
  am::cp_async_commit();
  // Causal: queries before n0 see none of these keys.
  const int m_begin = p.causal ? n0 / kQ : 0, m_end = (p.Sq + kQ - 1) / kQ;
  // Query tile mt into stage st; lse / delta by plain stores, published by the loop's barrier.
  // Queries >= Sq: zero Q and dO rows, lse = +inf (P = 0), delta = 0: they add nothing.
  auto load_queries = [&](int mt, int st) {
    am::load_tile<kQ, kD, kThreads>(sQ + st * kQ * kD, q, p.qs.s[2], mt * kQ, p.Sq, p.vec_q);
    am::load_tile<kQ, kD, kThreads>(sdO + st * kQ * kD, dout, p.dos.s[2], mt * kQ, p.Sq, p.vec_do);
    if (threadIdx.x < kQ) {
      const int i = mt * kQ + threadIdx.x;
      sLse[st * kQ + threadIdx.x] = i < p.Sq ? lse[int64_t(i) * p.ls.s[2]] * kLog2e : INFINITY;
      sDelta[st * kQ + threadIdx.x] = i < p.Sq ? delta[i] : 0.f;
    }
  };
  if (m_begin < m_end) load_queries(m_begin, 0);
  am::cp_async_commit();

  float dk[kD / 8][4] = {}, dv[kD / 8][4] = {};
  const int key_g = n0 + 16 * warp + lane / 4;  // this thread's keys: key_g, key_g + 8
  const int col_t = 2 * (lane % 4);

  for (int mt = m_begin; mt < m_end; ++mt) {
    const int st = (mt - m_begin) % 2;
    am::cp_async_wait<0>();
    __syncthreads();  // tile mt visible; every warp done with tile mt-1's stage
    if (mt + 1 < m_end) load_queries(mt + 1, st ^ 1);
    am::cp_async_commit();
    const T* const qs = sQ + st * kQ * kD;
    const T* const dos = sdO + st * kQ * kD;
    const float* const lse_s = sLse + st * kQ;
    const float* const delta_s = sDelta + st * kQ;
    const int m0 = mt * kQ;

    // S^T = K Q^T: 16 keys x kQ queries per warp.
    float s[kQ / 8][4] = {};
#pragma unroll
    for (int kd = 0; kd < kD / 16; ++kd) {
      uint32_t a[4];
      am::load_a<kD>(a, sK, 16 * warp, kd, lane);
#pragma unroll
      for (int j = 0; j < kQ / 16; ++j) {
        uint32_t bf[4];
        am::load_b_rows_n<kD>(bf, qs, 16 * j, kd, lane);
        am::mma_16816<T>(s[2 * j], a, bf[0], bf[1]);
        am::mma_16816<T>(s[2 * j + 1], a, bf[2], bf[3]);
      }
    }
    // P^T; causal: key j > query i gives 0 (only tiles reaching past the diagonal compare).
    const bool diag = p.causal && n0 + kBN - 1 > m0;
#pragma unroll
    for (int nt = 0; nt < kQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * nt + col_t + (e & 1);
        const float pv = exp2f(s[nt][e] * p.scale_log2 - lse_s[c]);
        s[nt][e] = diag && key_g + 8 * (e >> 1) > m0 + c ? 0.f : pv;
      }
    // dV += P^T dO (dO rows are the k index: ldmatrix.trans).
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) {
      uint32_t a[4];
      am::c_to_a<T>(a, s, kk);
#pragma unroll
      for (int jj = 0; jj < kD / 16; ++jj) {
        uint32_t bf[4];
        am::load_b_rows_k<kD>(bf, dos, kk, jj, lane);
        am::mma_16816<T>(dv[2 * jj], a, bf[0], bf[1]);
        am::mma_16816<T>(dv[2 * jj + 1], a, bf[2], bf[3]);
      }
    }
    // dP^T = V dO^T.
    float dp[kQ / 8][4] = {};
#pragma unroll
    for (int kd = 0; kd < kD / 16; ++kd) {
      uint32_t a[4];
      am::load_a<kD>(a, sV, 16 * warp, kd, lane);
#pragma unroll
      for (int j = 0; j < kQ / 16; ++j) {
        uint32_t bf[4];
        am::load_b_rows_n<kD>(bf, dos, 16 * j, kd, lane);
        am::mma_16816<T>(dp[2 * j], a, bf[0], bf[1]);
        am::mma_16816<T>(dp[2 * j + 1], a, bf[2], bf[3]);
      }
    }
    // dS^T = P^T (dP^T - delta) scale, in place of P^T.
#pragma unroll
    for (int nt = 0; nt < kQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = s[nt][e] * (dp[nt][e] - delta_s[8 * nt + col_t + (e & 1)]) * p.scale;
    // dK += dS^T Q.
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) {
      uint32_t a[4];
      am::c_to_a<T>(a, s, kk);
#pragma unroll
      for (int jj = 0; jj < kD / 16; ++jj) {
        uint32_t bf[4];
        am::load_b_rows_k<kD>(bf, qs, kk, jj, lane);
        am::mma_16816<T>(dk[2 * jj], a, bf[0], bf[1]);
        am::mma_16816<T>(dk[2 * jj + 1], a, bf[2], bf[3]);
      }
    }
  }

  // With no query tile (Sq = 0, or causal keys past every query) the loop never waited for the
  // K/V copies that the stores below overwrite: wait for every copy of every thread first.
  am::cp_async_wait<0>();
  __syncthreads();
  const float one[2] = {1.f, 1.f};
  am::store_rows<kD>(sK, 16 * warp, dk, one, p.dk + p.dks.head(b, head), p.dks.s[2], n0 + 16 * warp, p.Sk,
                     p.vec_dk, lane);
  am::store_rows<kD>(sV, 16 * warp, dv, one, p.dv + p.dvs.head(b, head), p.dvs.s[2], n0 + 16 * warp, p.Sk,
                     p.vec_dv, lane);
}

// Backward 3/3: dQ for 64 queries of one (batch, head), warp w rows 16w .. 16w+15, looping over
// key tiles like the forward: S = Q K^T, P = exp2(S scale log2e - lse log2e), dP = dO V^T,
// dS = P (dP - delta) scale, dQ += dS K (K rows are the k index: ldmatrix.trans). Q and dO A
// fragments are re-read from shared memory each tile (holding both in registers next to dQ, S
// and dP would pass the register limit at D = 128).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_dq(Backward<T> p) {
  constexpr int kN = kBNdq<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* const sQ = reinterpret_cast<T*>(smem);  // kBM x kD
  T* const sdO = sQ + kBM * kD;              // kBM x kD
  T* const sK = sdO + kBM * kD;              // 2 stages of kN x kD
  T* const sV = sK + 2 * kN * kD;            // 2 stages of kN x kD
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int m_tile = p.tiles - 1 - int(blockIdx.x % p.tiles);
  const int bh = int(blockIdx.x / p.tiles), b = bh / p.H, head = bh % p.H;
  const int m0 = m_tile * kBM;
  const T* const k = p.k + p.ks.head(b, head);
  const T* const v = p.v + p.vs.head(b, head);
  const int n_end = p.causal ? min(p.Sk, m0 + kBM) : p.Sk;
  const int n_tiles = (n_end + kN - 1) / kN;  // >= 1

  am::load_tile<kBM, kD, kThreads>(sQ, p.q + p.qs.head(b, head), p.qs.s[2], m0, p.Sq, p.vec_q);
  am::load_tile<kBM, kD, kThreads>(sdO, p.dout + p.dos.head(b, head), p.dos.s[2], m0, p.Sq, p.vec_do);
  am::load_tile<kN, kD, kThreads>(sK, k, p.ks.s[2], 0, p.Sk, p.vec_k);
  am::load_tile<kN, kD, kThreads>(sV, v, p.vs.s[2], 0, p.Sk, p.vec_v);
  am::cp_async_commit();

  const int row_g = m0 + 16 * warp + lane / 4;  // this thread's rows: row_g, row_g + 8
  const int col_t = 2 * (lane % 4);
  float lse2[2], delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = row_g + 8 * h;  // rows >= Sq are computed on zeros and never stored
    lse2[h] = i < p.Sq ? p.lse[p.ls.head(b, head) + int64_t(i) * p.ls.s[2]] * kLog2e : 0.f;
    delta[h] = i < p.Sq ? p.delta[int64_t(bh) * p.Sq + i] : 0.f;
  }
  float dq[kD / 8][4] = {};

  for (int t = 0; t < n_tiles; ++t) {
    am::cp_async_wait<0>();
    __syncthreads();  // tile t visible; every warp done with tile t-1's stage
    if (t + 1 < n_tiles) {
      const int st = (t + 1) % 2;
      am::load_tile<kN, kD, kThreads>(sK + st * kN * kD, k, p.ks.s[2], (t + 1) * kN, p.Sk, p.vec_k);
      am::load_tile<kN, kD, kThreads>(sV + st * kN * kD, v, p.vs.s[2], (t + 1) * kN, p.Sk, p.vec_v);
    }
    am::cp_async_commit();
    const T* const ks = sK + (t % 2) * kN * kD;
    const T* const vs = sV + (t % 2) * kN * kD;

    float s[kN / 8][4] = {};
#pragma unroll
    for (int kd = 0; kd < kD / 16; ++kd) {
      uint32_t a[4];
      am::load_a<kD>(a, sQ, 16 * warp, kd, lane);
#pragma unroll
      for (int j = 0; j < kN / 16; ++j) {
        uint32_t bf[4];
        am::load_b_rows_n<kD>(bf, ks, 16 * j, kd, lane);
        am::mma_16816<T>(s[2 * j], a, bf[0], bf[1]);
        am::mma_16816<T>(s[2 * j + 1], a, bf[2], bf[3]);
      }
    }
    // P; keys >= Sk must be 0 here (exp2(0 - lse) could overflow against a zero K row: inf * 0).
    const int n0 = t * kN;
    const bool edge = n0 + kN > p.Sk || (p.causal && n0 + kN - 1 > m0);
#pragma unroll
    for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pv = exp2f(s[nt][e] * p.scale_log2 - lse2[e >> 1]);
        const int j = n0 + 8 * nt + col_t + (e & 1), i = row_g + 8 * (e >> 1);
        s[nt][e] = edge && (j >= p.Sk || (p.causal && j > i)) ? 0.f : pv;
      }
    float dp[kN / 8][4] = {};
#pragma unroll
    for (int kd = 0; kd < kD / 16; ++kd) {
      uint32_t a[4];
      am::load_a<kD>(a, sdO, 16 * warp, kd, lane);
#pragma unroll
      for (int j = 0; j < kN / 16; ++j) {
        uint32_t bf[4];
        am::load_b_rows_n<kD>(bf, vs, 16 * j, kd, lane);
        am::mma_16816<T>(dp[2 * j], a, bf[0], bf[1]);
        am::mma_16816<T>(dp[2 * j + 1], a, bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = s[nt][e] * (dp[nt][e] - delta[e >> 1]) * p.scale;
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t a[4];
      am::c_to_a<T>(a, s, kk);
#pragma unroll
      for (int jj = 0; jj < kD / 16; ++jj) {
        uint32_t bf[4];
        am::load_b_rows_k<kD>(bf, ks, kk, jj, lane);
        am::mma_16816<T>(dq[2 * jj], a, bf[0], bf[1]);
        am::mma_16816<T>(dq[2 * jj + 1], a, bf[2], bf[3]);
      }
    }
  }

  const float one[2] = {1.f, 1.f};  // the loop's last wait left no copy in flight
  am::store_rows<kD>(sQ, 16 * warp, dq, one, p.dq + p.dqs.head(b, head), p.dqs.s[2], m0 + 16 * warp, p.Sq,
                     p.vec_dq, lane);
}

template <int kD> constexpr int kDkdvSmem = (2 * kBN + 4 * kBMkv<kD>) * kD * 2 + 4 * kBMkv<kD> * 4;  // 64.5 KB
template <int kD> constexpr int kDqSmem = (2 * kBM + 4 * kBNdq<kD>) * kD * 2;       // 64 KB

// f(integral_constant<int, D>) for D = 64 or 128 (checked by the caller).
template <typename F> void with_head_dim(int64_t d, F&& f) {
  if (d == 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

cudaError_t backward(const rosetta::AttentionBackwardArgs& a, cudaStream_t stream) {
  const int64_t B = a.q.size[0], H = a.q.size[1], Sq = a.q.size[2], D = a.q.size[3], Sk = a.k.size[2];
  if (D != 64 && D != 128) return cudaErrorInvalidValue;
  if (Sq > INT_MAX || Sk > INT_MAX || H > INT_MAX) return cudaErrorInvalidValue;
  if (B * H == 0 || Sk == 0) return Sq == 0 || B * H == 0 ? cudaSuccess : cudaErrorInvalidValue;
  const int64_t q_blocks = rosetta::ceil_div(Sq, kBM) * B * H, kv_blocks = rosetta::ceil_div(Sk, kBN) * B * H;
  const int64_t delta_blocks = rosetta::ceil_div(B * H * Sq, 8);
  if (q_blocks > INT_MAX || kv_blocks > INT_MAX || delta_blocks > INT_MAX) return cudaErrorInvalidValue;
  return rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Sq = 0: no delta or dQ work, but dK and dV are zeros: the dK/dV kernel still runs (no
    // query tiles) and stores them.
    float* delta = Sq > 0 ? a.workspace.get<float>(B * H * Sq) : nullptr;
    Backward<T> p{a.q.ptr<const T>(), a.k.ptr<const T>(), a.v.ptr<const T>(), a.out.ptr<const T>(),
                  a.dout.ptr<const T>(), a.lse.ptr<const float>(), delta, a.dq.ptr<T>(), a.dk.ptr<T>(), a.dv.ptr<T>(),
                  strides_of(a.q), strides_of(a.k), strides_of(a.v), strides_of(a.out), strides_of(a.dout),
                  strides_of(a.lse), strides_of(a.dq), strides_of(a.dk), strides_of(a.dv),
                  int(H), int(Sq), int(Sk), 0, a.causal ? 1 : 0, float(a.scale),
                  float(a.scale * 1.4426950408889634), vec_ok(a.q), vec_ok(a.k), vec_ok(a.v), vec_ok(a.dout),
                  vec_ok(a.dq), vec_ok(a.dk), vec_ok(a.dv)};
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      if (Sq > 0) {
        attention_delta<T, kD><<<unsigned(delta_blocks), 256, 0, stream>>>(p, B * H * Sq);
        p.tiles = int(rosetta::ceil_div(Sq, kBM));
        cudaFuncSetAttribute(attention_dq<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmem<kD>);
        attention_dq<T, kD><<<unsigned(q_blocks), kThreads, kDqSmem<kD>, stream>>>(p);
      }
      p.tiles = int(rosetta::ceil_div(Sk, kBN));
      cudaFuncSetAttribute(attention_dkdv<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDkdvSmem<kD>);
      attention_dkdv<T, kD><<<unsigned(kv_blocks), kThreads, kDkdvSmem<kD>, stream>>>(p);
    });
  });
}

}  // namespace
}  // namespace rosetta::attention_fa2
