/*
Step 3 — FlashAttention-2 on tensor cores: mma.sync + ldmatrix, cp.async double buffering
Changed:  every product (Q K^T, P V; backward's recomputed S, dV, dP, dS, dK, dQ) is
          mma.sync.m16n8k16 (HMMA) fed by ldmatrix from XOR-swizzled shared tiles, filled by a
          cp.async double buffer (zero-fill past Sq / Sk): this step is tensor cores and the copy
          pipeline at once. A warp owns 16 rows; Q (forward, D = 64) stays as A fragments in
          registers, and the softmax'ed S accumulators, rounded to bf16/fp16, are the P V MMA's A
          operand without leaving registers. Backward: a delta kernel, a dK/dV kernel (block per
          64 keys, loop over query tiles) and a dQ kernel (block per 64 queries, loop over key
          tiles): no atomics, deterministic (those kernels live in
          common/attention_fa2_backward.cuh).
Why:      attention is 4 Sq Sk D flop over (2 Sq + 2 Sk) D 2-byte values: at 4k x 4k, D = 128,
          2,048 flop per byte, far past the ridge, so the arithmetic engine is the ceiling:
          HMMA's ~660 TFLOP/s dense bf16 on H100 against ~67 TFLOP/s of fp32 FMA. A forward
          block copies each K/V tile (2 x 64 x D x 2 B) once for 4 x 64 x 64 x D flop (64 flop/B
          from L2), its 4 warps read it by ldmatrix (16 flop per shared byte); Q is read once per
          query block and the Sq x Sk scores never leave the chip.
Still:    mma.sync is warp-synchronous, register-staged, and tops out near 2/3 of Hopper's tensor
          peak; the softmax's MUFU/FMA work is serialized with the MMAs inside each warp. Next:
          wgmma reading K/V straight from shared memory, TMA loads, warp-specialized producer
          and ping-ponged softmax (FlashAttention-3). The backward re-reads K/V (dQ kernel) and
          Q/dO (dK/dV kernel) and recomputes P twice.
Limits:   head_dim 64 or 128; rows (dims 0-2) at any stride: 16-byte copies when a tensor's base
          and strides are multiples of 8 elements, scalar loads into the same tiles otherwise.
          Sq, Sk < 2^31, and ceil(Sq / 64) * B * H < 2^31 blocks (else cudaErrorInvalidValue).
Dtypes:   bfloat16, float16
Layout:   rows
*/
#include <climits>
#include <cmath>
#include <type_traits>

#include "attention_fa2_backward.cuh"
#include "attention_mma.cuh"
#include "primitives.cuh"

namespace {

namespace am = rosetta::attention_mma;
namespace fa2 = rosetta::attention_fa2;  // the backward's kernels

constexpr int kWarps = 4, kThreads = 32 * kWarps;  // a warp owns 16 rows of its block's tile
constexpr int kBM = 16 * kWarps;                   // 64 queries a forward block
constexpr int kBN = 64;                            // keys a tile
constexpr float kLn2 = 0.6931471805599453f;

using fa2::Strides;
using fa2::strides_of;
using fa2::vec_ok;
using fa2::with_head_dim;

template <typename T>
struct Forward {
  const T* q;
  const T* k;
  const T* v;
  T* out;
  float* lse;
  Strides qs, ks, vs, os, ls;
  int H, Sq, Sk, m_tiles, causal;
  float scale_log2;  // scale * log2(e): softmax in exp2
  bool vec_q, vec_k, vec_v, vec_o;
};

// ---------------------------------------------------------------------------------------------
// Forward. Block: 64 queries of one (batch, head); warp w: rows 16w .. 16w+15. Per thread, the S
// tile (16 x 64 per warp) is s[8][4]: n tile nt holds rows g, g+8 (g = lane / 4) at keys
// 8nt + 2t, +1 (t = lane % 4); a row's 64 scores live in the 4 lanes of a quad, so row max and
// sum are two __shfl_xor steps (1, 2). O (16 x D per warp) is o[D/8][4] in the same layout.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_forward(Forward<T> p) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* const sQ = reinterpret_cast<T*>(smem);  // kBM x kD
  T* const sK = sQ + kBM * kD;               // 2 stages of kBN x kD
  T* const sV = sK + 2 * kBN * kD;           // 2 stages of kBN x kD
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Heaviest (causal: last) query tiles first, so short ones fill the tail of the grid.
  const int m_tile = p.m_tiles - 1 - int(blockIdx.x % p.m_tiles);
  const int bh = int(blockIdx.x / p.m_tiles), b = bh / p.H, head = bh % p.H;
  const int m0 = m_tile * kBM;
  const T* const q = p.q + p.qs.head(b, head);
  const T* const k = p.k + p.ks.head(b, head);
  const T* const v = p.v + p.vs.head(b, head);
  // Causal: keys past the block's last query are masked for all its rows; never load them.
  const int n_end = p.causal ? min(p.Sk, m0 + kBM) : p.Sk;
  const int n_tiles = (n_end + kBN - 1) / kBN;  // >= 1: Sk >= 1 and m0 + kBM >= 1

  am::load_tile<kBM, kD, kThreads>(sQ, q, p.qs.s[2], m0, p.Sq, p.vec_q);
  am::cp_async_commit();
  am::load_tile<kBN, kD, kThreads>(sK, k, p.ks.s[2], 0, p.Sk, p.vec_k);
  am::load_tile<kBN, kD, kThreads>(sV, v, p.vs.s[2], 0, p.Sk, p.vec_v);
  am::cp_async_commit();
  am::cp_async_wait<1>();  // Q has landed (K/V tile 0 may still be in flight)
  __syncthreads();
  // The warp's 16 x kD Q strip as A fragments, for every key tile (D = 64: 16 registers). At
  // D = 128 the 32 registers it would take, beside O (64) and S (32), make ptxas spill: there
  // each key tile re-reads them from shared memory (8 more LDSM.x4 beside K's 32 and V's 32).
  constexpr bool kQInRegs = kD == 64;
  uint32_t qf[kQInRegs ? kD / 16 : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kd = 0; kd < kD / 16; ++kd) am::load_a<kD>(qf[kd], sQ, 16 * warp, kd, lane);
  }

  float o[kD / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};  // per row half h (rows g, g+8), in log2 units
  float row_sum[2] = {0.f, 0.f};              // this thread's part; the quad's sum at the end
  const int row_g = m0 + 16 * warp + lane / 4;
  const int col_t = 2 * (lane % 4);

  for (int t = 0; t < n_tiles; ++t) {
    am::cp_async_wait<0>();
    // Tile t visible to every warp, and every warp is done with tile t-1, whose stage the
    // copy below overwrites.
    __syncthreads();
    if (t + 1 < n_tiles) {
      const int st = (t + 1) % 2;
      am::load_tile<kBN, kD, kThreads>(sK + st * kBN * kD, k, p.ks.s[2], (t + 1) * kBN, p.Sk, p.vec_k);
      am::load_tile<kBN, kD, kThreads>(sV + st * kBN * kD, v, p.vs.s[2], (t + 1) * kBN, p.Sk, p.vec_v);
    }
    am::cp_async_commit();
    const T* const ks = sK + (t % 2) * kBN * kD;
    const T* const vs = sV + (t % 2) * kBN * kD;

    // S = Q K^T (16 x 64 per warp), raw dot products.
    float s[kBN / 8][4] = {};
#pragma unroll
    for (int kd = 0; kd < kD / 16; ++kd) {
      uint32_t a[4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = qf[kd][r];
      } else {
        am::load_a<kD>(a, sQ, 16 * warp, kd, lane);
      }
#pragma unroll
      for (int j = 0; j < kBN / 16; ++j) {
        uint32_t bf[4];
        am::load_b_rows_n<kD>(bf, ks, 16 * j, kd, lane);
        am::mma_16816<T>(s[2 * j], a, bf[0], bf[1]);
        am::mma_16816<T>(s[2 * j + 1], a, bf[2], bf[3]);
      }
    }

    // Scale into log2 units; mask keys >= Sk (zero-filled rows) and, causal, keys past the row.
    // Only the ragged last tile and the diagonal tile(s) need the compares.
    const int n0 = t * kBN;
    const bool edge = n0 + kBN > p.Sk || (p.causal && n0 + kBN - 1 > m0);
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * p.scale_log2;
        if (edge) {
          const int j = n0 + 8 * nt + col_t + (e & 1), i = row_g + 8 * (e >> 1);
          if (j >= p.Sk || (p.causal && j > i)) x = -INFINITY;
        }
        s[nt][e] = x;
      }

    // Online softmax: new row max over the quad, rescale O and the running sum, P = exp2(S - m).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[h];
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with nothing unmasked yet keeps m = -inf; exp2(-inf - 0) = 0 keeps it at zero
      // instead of NaN. (Key 0 is in every row's first tile, so this is only a guard.)
      const float m_use = mx == -INFINITY ? 0.f : mx;
      const float alpha = exp2f(row_max[h] - m_use);  // 0 on the first tile (-inf - m)
      row_max[h] = mx;
      row_sum[h] *= alpha;
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt) {
        o[nt][2 * h] *= alpha;
        o[nt][2 * h + 1] *= alpha;
      }
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[nt][e] = exp2f(s[nt][e] - m_use);
          row_sum[h] += s[nt][e];  // fp32 P in the sum; the MMA gets P rounded to T
        }
    }

    // O += P V: P's C tiles 2kk, 2kk+1 are the A fragment of key step kk; V through ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[4];
      am::c_to_a<T>(a, s, kk);
#pragma unroll
      for (int jj = 0; jj < kD / 16; ++jj) {
        uint32_t bf[4];
        am::load_b_rows_k<kD>(bf, vs, kk, jj, lane);
        am::mma_16816<T>(o[2 * jj], a, bf[0], bf[1]);
        am::mma_16816<T>(o[2 * jj + 1], a, bf[2], bf[3]);
      }
    }
  }

  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[h] = 1.f / l;  // l >= 1: the row max's own term is exp2(0)
    const int i = row_g + 8 * h;
    if (lane % 4 == 0 && i < p.Sq)  // natural log: m and log2(l) are in log2 units
      p.lse[p.ls.head(b, head) + int64_t(i) * p.ls.s[2]] = (row_max[h] + log2f(l)) * kLn2;
  }
  // O / l through the warp's own Q rows (no other warp reads them) to 16-byte stores.
  am::store_rows<kD>(sQ, 16 * warp, o, inv, p.out + p.os.head(b, head), p.os.s[2], m0 + 16 * warp, p.Sq,
                     p.vec_o, lane);
}

template <int kD> constexpr int kForwardSmem = (kBM + 4 * kBN) * kD * 2;            // 80 KB at D = 128

}  // namespace

cudaError_t attention_03_mma_sync(const rosetta::AttentionArgs& a, cudaStream_t stream) {
  const int64_t B = a.q.size[0], H = a.q.size[1], Sq = a.q.size[2], D = a.q.size[3], Sk = a.k.size[2];
  if (D != 64 && D != 128) return cudaErrorInvalidValue;
  if (Sq > INT_MAX || Sk > INT_MAX || H > INT_MAX) return cudaErrorInvalidValue;
  if (B * H == 0 || Sq == 0) return cudaSuccess;
  if (Sk == 0) return cudaErrorInvalidValue;  // softmax over no keys (the spec rules it out)
  const int64_t m_tiles = rosetta::ceil_div(Sq, kBM), blocks = m_tiles * B * H;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  return rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    const Forward<T> p{a.q.ptr<const T>(), a.k.ptr<const T>(), a.v.ptr<const T>(), a.out.ptr<T>(), a.lse.ptr<float>(),
                       strides_of(a.q), strides_of(a.k), strides_of(a.v), strides_of(a.out), strides_of(a.lse),
                       int(H), int(Sq), int(Sk), int(m_tiles), a.causal ? 1 : 0,
                       float(a.scale * 1.4426950408889634), vec_ok(a.q), vec_ok(a.k), vec_ok(a.v), vec_ok(a.out)};
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      cudaFuncSetAttribute(attention_forward<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kForwardSmem<kD>);
      attention_forward<T, kD><<<unsigned(blocks), kThreads, kForwardSmem<kD>, stream>>>(p);
    });
  });
}

// The FA2 kernels of common/attention_fa2_backward.cuh.
cudaError_t attention_03_mma_sync_backward(const rosetta::AttentionBackwardArgs& a, cudaStream_t stream) {
  return fa2::backward(a, stream);
}
