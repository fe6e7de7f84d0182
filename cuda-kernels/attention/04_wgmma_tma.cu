/*
Step 4 — FlashAttention-3 on Hopper, forward and backward: wgmma fed by TMA, warp-specialized
Changed:  the forward block is 3 warpgroups over 128 queries: warpgroup 0 only copies (one thread
          issues TMA boxes of Q once and of K, V per key tile into a ring: 176 keys x 2 stages at D
          = 128 non-causal from 8k keys, FA3's tile; else 128 x 3, or 128 x 4 at D = 64; setmaxnreg
          gives its registers away), warpgroups 1-2 own 64 queries each. S = Q K^T is wgmma from
          swizzled shared memory (m64n176k16 at 176 keys: 88 fp32 of S a thread); O += P V is wgmma
          with P from registers (the softmax'ed S accumulators are its A fragments; 11 k slices at
          176 keys) and V read through the transpose bit. Each consumer issues the next tile's Q K^T
          before its softmax and lets P V run under it, and the two consumers take turns at issuing
          (named barriers), so one's exp2s run under the other's MMAs (ping-pong). The scale rides
          in the exponent: P = exp2(k s - k max(s)) is one FFMA and one exp2 a score, the max taken
          on raw scores, so interior tiles never multiply S by the scale on its own (ragged and
          diagonal tiles do, then mask). The backward (common/attention_sm90_backward.cuh) turns it
          around: a block owns 128 keys, keeps dK, dV in registers and streams 64-query tiles of Q,
          dO, lse, delta; with keys as M, P^T and dS^T feed dV += P^T dO and dK += dS^T Q from
          registers, dQ = dS K reads dS^T back from shared memory, and each tile's fp32 dQ partial
          is one bulk reduce-add into a global accumulator (a pre-kernel computes delta and zeroes
          it, a post-kernel scales it into dQ).
Why:      step 3's mma.sync peaks near 2/3 of Hopper's dense tensor rate and every warp stalls
          on its own ldmatrix / exp2 / MMA chain; wgmma reads K and V straight from shared memory
          at the full 989 TFLOP/s rate. A 128 x 128 tile is 4.2 M MACs per consumer pair, ~2,050
          tensor-core cycles an SM; its 16 K exp2s take ~1,020 cycles of the 16 / cycle MUFU and
          the rest of the softmax ~700 issue cycles a sub-partition, so with the softmax hidden
          under the other warpgroup's MMAs the tensor cores stay busy ~75-85% of the time:
          expected ~600-650 TFLOP/s at B = 4, H = 16, 4k x 4k, D = 128 (step 3: 193; cuDNN:
          670), ~65% of peak. Loads are 32 KB of K or V per 4.2 M MACs from L2 (~0.5 TB/s at
          600 TFLOP/s).
          176-key tiles (D = 128 non-causal, from 8k keys) spread each tile's fixed softmax work
          over 37.5% more keys; below 8k the 2-deep ring's fill and the padded last tile cost more
          (bench/ablations/attention_04_tile.py).
          Backward: a (128-key, 64-query) tile is 5 products of 1 M MACs (~2,560 tensor-core
          cycles an SM); its exp2s, the dS math, dS^T and the dQ partials through shared memory
          and two barriers mostly do not overlap the MMAs (the consumers meet every tile):
          expected ~380 TFLOP/s at 4k x 4k, D = 128 (~330 causal, ~260 at D = 64; step 3: 154).
          The dQ reduce-adds are 32 KB of L2 atomics per 5.2 M MACs.
Still:    not persistent: each block pays its Q load and pipeline fill with the tensor cores idle
          (~5% at 32 key tiles a block) and stores O with 16-byte stores after its last tile; the
          causal diagonal tile is computed in full and masked, and causal keeps 128-key tiles (its
          diagonal logic wants kBN == kBM); D = 64 keeps 128-query blocks (FA3 uses 192). Backward:
          dQ is summed by fp32 atomic adds (bulk reduce-add) in whatever order the blocks reach
          them, so dQ is not bit-for-bit deterministic (dK, dV are); no overlap of one tile's dQ
          write-out with the next tile's MMAs (registers: dK + dV alone are 128 a thread at
          D = 128); causal diagonal tiles computed in full and masked; at D = 64 each consumer
          reduces its own keys' dQ (two 16 KB adds a tile).
Limits:   head_dim 64 or 128; q, k, v (and the backward's dout) with the head dim contiguous, a
          16-byte aligned base and batch / head / row strides in whole 16-byte units (the copy
          engine's rules; Layout: tma_rows makes the dispatcher copy anything else); out and lse at
          any row strides (16-byte stores where out's rows allow). Sq, Sk < 2^31, ceil(Sq / 128)
          * B * H < 2^31 forward blocks and ceil(Sk / 128) * B * H backward blocks (else
          cudaErrorInvalidValue). The backward takes (B * H * ceil(Sq / 64) * 64) * (D + 2) fp32
          of workspace.
Dtypes:   bfloat16, float16
Layout:   tma_rows
*/
#include <climits>
#include <cmath>
#include <type_traits>

#include "attention_mma.cuh"
#include "attention_sm90.cuh"
#include "attention_sm90_backward.cuh"
#include "hopper.cuh"

namespace {

namespace sm90 = rosetta::sm90;
namespace a90 = rosetta::attention_sm90;
namespace am = rosetta::attention_mma;

constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers);  // a producer + 2 consumer warpgroups
constexpr int kBM = 64 * kConsumers;                              // 128 queries a block, 64 a consumer
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "the register file holds the budgets");
constexpr float kLn2 = 0.6931471805599453f;
constexpr int64_t kWideTileKeys = 8192;  // 176-key tiles from here (measured: see the header's Why)
// Named barriers (0 is __syncthreads): the two consumers' issue turns, then each consumer's own.
constexpr int kTurnBarrier = 1, kConsumerBarrier = 3;

// kBN keys a tile: 176 at D = 128 non-causal from kWideTileKeys keys (FA3's tile: the per-tile
// softmax work is spread over more keys), else 128 (causal's diagonal tiles are laid out for
// kBN == kBM). Every K / V box (kBN rows of 128 bytes) and stage then starts on a 1024-byte
// boundary, the 128-byte swizzle's atom: 176 * 128 = 22 * 1024.
template <int kD, int kBN>
struct Config {
  static_assert(kBN % 16 == 0 && kBN <= 256, "whole k16 slices of P V; one TMA box and wgmma n of keys");
  static constexpr int kQBytes = 64 * kD * 2;   // one consumer's Q rows: kD / 64 boxes of 64 x 64
  static constexpr int kKVBytes = kBN * kD * 2;  // one K or V tile: kD / 64 boxes of kBN x 64
  // D = 128: 3 stages of 128 keys (225 KB with Q) or 2 of 176 (209 KB; 3 would need 297 KB).
  static constexpr int kStages = kD == 64 ? 4 : kBN == 128 ? 3 : 2;
  static constexpr int kBarriers = 1 + 4 * kStages;  // Q full; K full, V full, K empty, V empty
  static constexpr int kSmemBytes = kConsumers * kQBytes + 2 * kStages * kKVBytes + 8 * kBarriers + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one block");
};

struct Strides {
  int64_t s[3];  // batch, head, row (elements)
  __host__ __device__ int64_t head(int b, int h) const { return b * s[0] + h * s[1]; }
};
inline Strides strides_of(const rosetta::Tensor& t) { return Strides{{t.stride[0], t.stride[1], t.stride[2]}}; }

template <typename T>
struct Forward {
  T* out;
  float* lse;
  Strides os, ls;
  int H, Sq, Sk, m_tiles, causal;
  float scale_log2;  // scale * log2(e): softmax in exp2
  bool vec_o;
};

// 128-byte-swizzle descriptors (hopper.cuh's OperandTile, here over boxes of 64 d columns):
// K-major Q and K: row r of box j at j * box_bytes + r * 128, k slice kk (16 d) 32 bytes in,
// SBO 1024 between 8-row groups. V is MN-major for P V (its rows are the k index): k slice kk
// is rows 16kk .. at byte 2048 kk, SBO 1024 between its two 8-row halves, LBO = one box (kBN
// rows, kBN * 128 bytes) between the 64-wide d blocks of an n = 128 instruction.
__device__ __forceinline__ uint64_t kmajor_desc(const unsigned char* tile, int box_bytes, int kk) {
  return sm90::smem_descriptor(tile + (kk / 4) * box_bytes + (kk % 4) * 32, 16, 1024);
}
template <int kBN>
__device__ __forceinline__ uint64_t v_desc(const unsigned char* tile, int kk) {
  return sm90::smem_descriptor(tile + kk * 2048, kBN * 128, 1024);
}

template <typename T, int kD, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    attention_forward_sm90(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                           const __grid_constant__ CUtensorMap map_v, const Forward<T> p) {
  using C = Config<kD, kBN>;
  constexpr int kStages = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  unsigned char* const sQ = smem;                                // consumer c's rows at c * kQBytes
  unsigned char* const sK = sQ + kConsumers * C::kQBytes;        // stage s at s * kKVBytes
  unsigned char* const sV = sK + kStages * C::kKVBytes;
  uint64_t* const full_q = reinterpret_cast<uint64_t*>(sV + kStages * C::kKVBytes);
  uint64_t* const full_k = full_q + 1;
  uint64_t* const full_v = full_k + kStages;
  uint64_t* const empty_k = full_v + kStages;
  uint64_t* const empty_v = empty_k + kStages;

  // Heaviest (causal: last) query tiles first, so short ones fill the tail of the grid.
  const int m_tile = p.m_tiles - 1 - int(blockIdx.x % p.m_tiles);
  const int bh = int(blockIdx.x / p.m_tiles), b = bh / p.H, head = bh % p.H;
  const int m0 = m_tile * kBM;
  // Causal: keys past the block's last query are masked for all its rows; never load them. With
  // kBN == kBM (the only causal tile the launcher picks) every loaded tile has unmasked keys for
  // both consumers' rows.
  const int n_end = p.causal ? min(p.Sk, m0 + kBM) : p.Sk;
  const int n_tiles = (n_end + kBN - 1) / kBN;  // >= 1

  if (threadIdx.x == 0) {
    sm90::mbarrier_init(full_q, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(&full_k[s], 1);  // the producer's expect_tx, then the bytes
      sm90::mbarrier_init(&full_v[s], 1);
      sm90::mbarrier_init(&empty_k[s], kConsumers);  // one arrival per consumer warpgroup
      sm90::mbarrier_init(&empty_v[s], kConsumers);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::set_max_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      // Boxes past Sq / Sk (and the whole second half of Q when Sq <= m0 + 64) read as zeros;
      // their bytes still count toward the transaction.
      sm90::mbarrier_arrive_expect_tx(full_q, kConsumers * C::kQBytes);
      for (int c = 0; c < kConsumers; ++c)
        for (int j = 0; j < kD / 64; ++j)
          a90::tma_load_4d(sQ + c * C::kQBytes + j * 8192, &map_q, full_q, 64 * j, m0 + 64 * c, head, b);
      for (int t = 0; t < n_tiles; ++t) {
        const int s = t % kStages;
        // Fill f = t / kStages of a stage waits for both consumers' release of fill f - 1 (parity
        // (f - 1) % 2; a fresh barrier's parity-1 phase counts as complete).
        const uint32_t parity = ((t / kStages) & 1) ^ 1;
        sm90::mbarrier_wait(&empty_k[s], parity);
        sm90::mbarrier_arrive_expect_tx(&full_k[s], C::kKVBytes);
        for (int j = 0; j < kD / 64; ++j)
          a90::tma_load_4d(sK + s * C::kKVBytes + j * (kBN * 128), &map_k, &full_k[s], 64 * j, t * kBN, head, b);
        sm90::mbarrier_wait(&empty_v[s], parity);
        sm90::mbarrier_arrive_expect_tx(&full_v[s], C::kKVBytes);
        for (int j = 0; j < kD / 64; ++j)
          a90::tma_load_4d(sV + s * C::kKVBytes + j * (kBN * 128), &map_v, &full_v[s], 64 * j, t * kBN, head, b);
      }
    }
    return;
  }

  sm90::set_max_registers<kConsumerRegs>();
  const int c = wg - 1;  // consumer 0 or 1: queries m0 + 64c ..
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  unsigned char* const q_tile = sQ + c * C::kQBytes;
  const int row0 = m0 + 64 * c;
  const int row_g = row0 + 16 * warp + lane / 4;  // this thread's rows: row_g, row_g + 8
  const int col_t = 2 * (lane % 4);

  // Issue turns: a consumer waits at its own barrier (256 = its 128 threads + the other's 128
  // arrivals) before issuing a tile's MMAs and signals the other's once they are issued, so
  // one warpgroup's softmax overlaps the other's MMAs instead of both contending at once.
  // Consumer 0 signals itself once to take the first turn; consumer 1 skips its last signal,
  // which no one would wait for: every barrier ends the block with no arrivals pending.
  if (c == 0) a90::named_barrier_arrive(kTurnBarrier, 256);
  auto take_turn = [&] { sm90::named_barrier(kTurnBarrier + c, 256); };
  auto pass_turn = [&](bool last) {
    if (c == 0 || !last) a90::named_barrier_arrive(kTurnBarrier + (c ^ 1), 256);
  };
  auto release = [&](uint64_t* bar) {
    if (tid == 0) sm90::mbarrier_arrive(bar);
  };

  float o[kD / 2];  // O (64 x kD per warpgroup), accumulator layout
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  float s[kBN / 2];          // S of the tile in flight, then its P (fp32)
  uint32_t pa[kBN / 16][4];  // P rounded to T: the A fragments of P V's kBN / 16 k slices
  float row_max[2] = {-INFINITY, -INFINITY};  // rows g, g + 8, scaled log2 units
  float row_sum[2] = {0.f, 0.f};              // this thread's part; the quad's sum at the end
  float alpha[2] = {1.f, 1.f};                // O's rescale for the last softmax'ed tile

  // S = Q K_t^T (issued, not waited for).
  auto issue_qk = [&](int t) {
    const int st = t % kStages;
    sm90::mbarrier_wait(&full_k[st], (t / kStages) & 1);
    const unsigned char* const k_tile = sK + st * C::kKVBytes;
    sm90::wgmma_fence();  // s was read (converted to P) before this overwrites it
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      a90::wgmma_ss<T, kBN>(s, kmajor_desc(q_tile, 8192, kk), kmajor_desc(k_tile, kBN * 128, kk), kk > 0);
    sm90::wgmma_commit();
  };
  // O += P V_t with the P of tile t in pa (issued, not waited for).
  auto issue_pv = [&](int t) {
    const int st = t % kStages;
    sm90::mbarrier_wait(&full_v[st], (t / kStages) & 1);
    const unsigned char* const v_tile = sV + st * C::kKVBytes;
    sm90::wgmma_fence();  // O's rescale and pa's conversion happen before the MMAs read them
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) a90::wgmma_rs<T, kD>(o, pa[kk], v_desc<kBN>(v_tile, kk));
    sm90::wgmma_commit();
  };
  // Online softmax of tile t's raw scores in s, the scale folded into the exponent's FFMA:
  // exp2(k s - m) with m = max(k s) = k max(s) for k >= 0, so interior tiles never multiply S by
  // the scale on its own. The ragged last tile and, causal, the diagonal one (and every tile
  // under a negative scale, where max(k s) would be k min(s)) scale first, mask to -inf, and run
  // the same code with k = 1. Then the new row max over the quad, alpha = exp2(old max - new max)
  // for O and the running sum, and s = P = exp2(k s - max) in fp32.
  auto softmax = [&](int t) {
    const int n0 = t * kBN;
    const bool edge = n0 + kBN > p.Sk || (p.causal && n0 + kBN - 1 > row0);
    float k = p.scale_log2;
    if (edge || k < 0.f) {
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) {
        const int j = n0 + 8 * (i / 4) + col_t + (i & 1), q = row_g + 8 * ((i / 2) & 1);
        s[i] = j >= p.Sk || (p.causal && j > q) ? -INFINITY : s[i] * k;
      }
      k = 1.f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int cc = 0; cc < kBN / 8; ++cc) mx = fmaxf(mx, fmaxf(s[4 * cc + 2 * h], s[4 * cc + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(row_max[h], k * fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2)));
      // A row with nothing unmasked yet keeps m = -inf; subtracting 0 instead keeps its P at 0
      // rather than NaN (key 0 is in every row's first tile, so this is only a guard).
      const float m_use = mx == -INFINITY ? 0.f : mx;
      alpha[h] = a90::exp2_approx(row_max[h] - m_use);  // 0 on the first tile (-inf - m)
      row_max[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int cc = 0; cc < kBN / 8; ++cc)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * cc + 2 * h + e;
          s[i] = a90::exp2_approx(fmaf(s[i], k, -m_use));
          sum += s[i];  // fp32 P in the sum; the MMA gets P rounded to T
        }
      row_sum[h] = row_sum[h] * alpha[h] + sum;
    }
  };
  // P's k slice kk (keys 16kk .. 16kk+15) is accumulator columns 8(2kk) .. 8(2kk+1)+7: a[r] =
  // the pair d[8kk + 2r], d[8kk + 2r + 1] (a[0] row g, a[1] row g+8, a[2], a[3] the next 8 keys).
  auto convert_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = am::pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  };
  auto rescale_o = [&] {
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] *= alpha[(i / 2) & 1];
  };

  sm90::mbarrier_wait(full_q, 0);
  take_turn();
  issue_qk(0);
  pass_turn(n_tiles == 1);
  sm90::wgmma_wait<0>();
  sm90::fence_accumulators(s);
  release(&empty_k[0]);
  softmax(0);
  for (int t = 1; t < n_tiles; ++t) {
    // P V_{t-2} ran under softmax(t-1). Its wait heads the iteration rather than closing the
    // last one: ptxas hoists a wgmma wait above independent math in the same basic block, which
    // would serialize that softmax behind the MMA; the loop's back edge keeps it in place.
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(o);
    if (t >= 2) release(&empty_v[(t - 2) % kStages]);
    convert_p();  // P_{t-1}: pa is free, P V_{t-2} has read it
    take_turn();
    issue_qk(t);
    rescale_o();  // by softmax(t-1)'s alpha, under the Q K^T MMAs, before P_{t-1} V_{t-1} adds to O
    issue_pv(t - 1);
    pass_turn(t == n_tiles - 1);
    sm90::wgmma_wait<1>();  // Q K_t^T is done; P V_{t-1} runs on under this softmax
    sm90::fence_accumulators(s);
    release(&empty_k[t % kStages]);
    softmax(t);
  }
  sm90::wgmma_wait<0>();
  sm90::fence_accumulators(o);
  if (n_tiles >= 2) release(&empty_v[(n_tiles - 2) % kStages]);
  convert_p();
  rescale_o();
  issue_pv(n_tiles - 1);
  sm90::wgmma_wait<0>();
  sm90::fence_accumulators(o);
  release(&empty_v[(n_tiles - 1) % kStages]);

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
  // O / l through this warpgroup's own Q rows: every warp's MMAs are done reading them first.
  sm90::named_barrier(kConsumerBarrier + c, 128);
  am::store_rows<kD>(reinterpret_cast<T*>(q_tile), 16 * warp, reinterpret_cast<const float(&)[kD / 8][4]>(o), inv,
                     p.out + p.os.head(b, head), p.os.s[2], row0 + 16 * warp, p.Sq, p.vec_o, lane);
}

// f(integral_constant<int, D>) for D = 64 or 128 (checked by the caller).
template <typename F> void with_head_dim(int64_t d, F&& f) {
  if (d == 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

// 16-byte stores of out's rows are legal when its base and every row start are 16-byte aligned.
inline bool vec_ok(const rosetta::Tensor& t) {
  bool ok = rosetta::aligned16(t.data);
  for (int d = 0; d < 3; ++d) ok = ok && (t.size[d] == 1 || t.stride[d] % 8 == 0);
  return ok;
}

// Tensor maps with kBN-row K, V boxes, then the launch (errors from the launch itself show up
// in dispatch_dtype's check, as before).
template <typename T, int kD, int kBN>
cudaError_t launch_forward(const rosetta::AttentionArgs& a, const Forward<T>& p, unsigned blocks,
                           cudaStream_t stream) {
  CUtensorMap map_q{}, map_k{}, map_v{};
  if (!a90::encode_heads_map<T>(map_q, a.q, 64) || !a90::encode_heads_map<T>(map_k, a.k, kBN) ||
      !a90::encode_heads_map<T>(map_v, a.v, kBN))
    return cudaErrorInvalidValue;
  constexpr int kSmem = Config<kD, kBN>::kSmemBytes;
  cudaFuncSetAttribute(attention_forward_sm90<T, kD, kBN>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  attention_forward_sm90<T, kD, kBN><<<blocks, kThreads, kSmem, stream>>>(map_q, map_k, map_v, p);
  return cudaSuccess;
}

}  // namespace

cudaError_t attention_04_wgmma_tma(const rosetta::AttentionArgs& a, cudaStream_t stream) {
  const int64_t B = a.q.size[0], H = a.q.size[1], Sq = a.q.size[2], D = a.q.size[3], Sk = a.k.size[2];
  if (D != 64 && D != 128) return cudaErrorInvalidValue;
  if (Sq > INT_MAX || Sk > INT_MAX || H > INT_MAX) return cudaErrorInvalidValue;
  if (B * H == 0 || Sq == 0) return cudaSuccess;
  if (Sk == 0) return cudaErrorInvalidValue;  // softmax over no keys (the spec rules it out)
  const int64_t m_tiles = rosetta::ceil_div(Sq, kBM), blocks = m_tiles * B * H;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  // The encoder is a driver call: bind the current device's primary context first (torch's
  // autograd thread may not have one; hopper.cuh's encode_map does the same).
  int device = 0;
  cudaGetDevice(&device);
  cudaSetDevice(device);
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    const Forward<T> p{a.out.ptr<T>(), a.lse.ptr<float>(), strides_of(a.out), strides_of(a.lse), int(H), int(Sq),
                       int(Sk), int(m_tiles), a.causal ? 1 : 0, float(a.scale * 1.4426950408889634), vec_ok(a.out)};
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      // FA3's 176-key tile at D = 128 non-causal on long key loops; causal (diagonal tiles: kBN ==
      // kBM) and D = 64 keep 128.
      if constexpr (kD == 128) {
        if (!a.causal && Sk >= kWideTileKeys)
          status = launch_forward<T, kD, 176>(a, p, unsigned(blocks), stream);
        else status = launch_forward<T, kD, 128>(a, p, unsigned(blocks), stream);
      } else {
        status = launch_forward<T, kD, 128>(a, p, unsigned(blocks), stream);
      }
    });
  });
  return status != cudaSuccess ? status : launched;
}

cudaError_t attention_04_wgmma_tma_backward(const rosetta::AttentionBackwardArgs& a, cudaStream_t stream) {
  return rosetta::attention_sm90_bwd::backward(a, stream);
}
