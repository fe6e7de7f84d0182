// FlashAttention-3's backward on Hopper (sm_90a), attention step 4's:
//   backward(args, stream)   three kernels: a preprocess (delta = rowsum(dO o O) and lse in log2
//                            units, both fp32 and padded to whole 64-query tiles; the fp32 dQ
//                            accumulator zeroed), the main kernel (one block per 128 keys: dK, dV
//                            in registers, dQ partial sums added to the accumulator by the copy
//                            engine's bulk reduce-add), a postprocess (dQ = scale * accumulator, as T)
//   wgmma_ss_n64<T, tA, tB>  d (64 x 64 fp32) = (acc ? d : 0) + A B from shared memory, either
//                            operand MN-major (transpose bit)
//   bulk_reduce_add          cp.reduce.async.bulk .add.f32: shared -> global, element-wise add
// The main kernel's layout, per (128-key block, b, h): warpgroup 0 copies (one thread: K and V of
// the block once, then a 2-stage ring of 64-query tiles: Q, dO boxes by TMA and the tile's lse2 /
// delta by 1-D bulk copies); consumer warpgroup c owns keys n0 + 64c .. + 63 and per query tile
// computes, with its keys as wgmma's M side:
//   S^T = K_c Q^T, dP^T = V_c dO^T               SS m64n64, both K-major
//   P^T = exp2(S^T scale log2e - lse2[q])       masked: keys >= Sk, causal key > query -> 0
//   dS^T = P^T o (dP^T - delta[q])              (scale applied at the end: dK here, dQ in the
//                                                postprocess)
//   dV += P^T dO, dK += dS^T Q                   RS m64nD: P^T, dS^T as A fragments straight from
//                                                the accumulators, dO / Q MN-major (transpose bit)
//   dS^T -> shared memory (bf16, 128B swizzle), then dQ_partial = dS K: SS m64n64 with A = dS^T
//   read MN-major; D = 128: consumer c takes d columns 64c .. over all 128 keys (both consumers'
//   dS^T, one 256-thread barrier), D = 64: consumer c takes all 64 columns over its own 64 keys
//   (no barrier between the consumers; two reduce-adds a tile instead of one)
//   dQ_partial -> shared memory (fp32, in accumulator-fragment order) -> one bulk reduce-add of
//   16 KB into the accumulator's (b, h, query tile) block, which keeps that same order; the
//   postprocess undoes it.
#pragma once

#include <climits>
#include <cmath>
#include <type_traits>

#include "attention.cuh"
#include "attention_mma.cuh"
#include "attention_sm90.cuh"
#include "hopper.cuh"

namespace rosetta::attention_sm90_bwd {
namespace {

namespace sm90 = rosetta::sm90;
namespace a90 = rosetta::attention_sm90;
namespace am = rosetta::attention_mma;

constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers);  // a producer + 2 consumer warpgroups
constexpr int kBN = 64 * kConsumers;                              // 128 keys a block, 64 a consumer
constexpr int kBM = 64;                                           // queries a tile
constexpr int kStages = 2;                                        // query tiles in flight
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "the register file holds the budgets");
constexpr float kLog2e = 1.4426950408889634f;
// Named barriers (0 is __syncthreads): dS^T written (D = 128: both consumers at id 1; D = 64: each
// its own, 1 + c), and each consumer's own dQ buffer written (3 + c).
constexpr int kDsBarrier = 1, kDqBarrier = 3;

template <int kD>
struct Config {
  static constexpr int kKVBytes = kBN * kD * 2;  // K or V of the block: kD / 64 boxes of kBN x 64
  static constexpr int kQBytes = kBM * kD * 2;   // one Q or dO tile: kD / 64 boxes of kBM x 64
  static constexpr int kDsBytes = kBN * kBM * 2;  // dS^T (keys x queries), T
  static constexpr int kDqBytes = 64 * 64 * 4;    // one consumer's dQ partial (64 x 64 fp32)
  static constexpr int kVecBytes = kBM * 4;       // one tile's lse2 or delta
  static constexpr int kBarriers = 1 + 2 * kStages;  // K/V full; per stage full, empty
  static constexpr int kSmemBytes = 2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDsBytes + kConsumers * kDqBytes +
                                    2 * kStages * kVecBytes + 8 * kBarriers + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one block");
  static_assert(kDqBytes >= 64 * kD * 2, "a consumer's dQ buffer holds its 64 dK or dV rows as T");
};

struct Strides {
  int64_t s[3];  // batch, head, row (elements)
  __host__ __device__ int64_t head(int b, int h) const { return b * s[0] + h * s[1]; }
};
inline Strides strides_of(const rosetta::Tensor& t) { return Strides{{t.stride[0], t.stride[1], t.stride[2]}}; }

template <typename T>
struct Backward {
  const T* out;
  const T* dout;
  const float* lse;
  float* lse2;    // (B * H, m_tiles * kBM): lse * log2(e); +inf past Sq (P = 0 there)
  float* delta;   // (B * H, m_tiles * kBM): rowsum(dO o O); 0 past Sq
  float* dq_acc;  // (B * H, m_tiles) blocks of kBM * kD fp32, in accumulator-fragment order
  T* dq;
  T* dk;
  T* dv;
  Strides os, dos, ls, dqs, dks, dvs;
  int H, Sq, Sk, m_tiles, n_tiles, causal;
  float scale, scale_log2;
  bool vec_o, vec_do, vec_dk, vec_dv, pairs_dq;
};

#define ROSETTA_BWD_ACC32 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
  "}"
#define ROSETTA_BWD_ACC32_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (64 x 64) = (accumulate ? d : 0) + A (64 x 16) B (16 x 64), both from 128B-swizzled shared
// memory; kTransA / kTransB: that operand is MN-major (16-bit types only). Accumulator layout as
// attention_sm90.cuh's: d[4c + 2h + e] is row 16w + g + 8h, column 8c + 2t + e.
template <typename T, bool kTransA, bool kTransB>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " ROSETTA_BWD_ACC32
                 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : ROSETTA_BWD_ACC32_OPERANDS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(int(kTransA)), "n"(int(kTransB)));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ROSETTA_BWD_ACC32
                 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : ROSETTA_BWD_ACC32_OPERANDS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(int(kTransA)), "n"(int(kTransB)));
  }
}
#undef ROSETTA_BWD_ACC32
#undef ROSETTA_BWD_ACC32_OPERANDS

// dst[i] += src[i] for bytes / 4 floats (both 16-byte aligned, bytes a multiple of 16), read from
// shared memory and added in L2 by the copy engine; completes in this thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add(float* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(dst), "r"(sm90::smem_u32(src)), "r"(bytes) : "memory");
}

// Descriptors over 128B-swizzled tiles of 64-column boxes (hopper.cuh's conventions).
// K-major (rows of 64 d per box, box_bytes apart): k slice kk is 16 d at box kk / 4, 32 (kk % 4) in.
__device__ __forceinline__ uint64_t kmajor_desc(const unsigned char* rows, int box_bytes, int kk) {
  return sm90::smem_descriptor(rows + (kk / 4) * box_bytes + (kk % 4) * 32, 16, 1024);
}
// MN-major (the k index runs down the rows, 64 MN values a 128-byte row, lbo between 64-wide MN
// blocks): k slice kk is rows 16kk .., 2048 kk bytes in.
__device__ __forceinline__ uint64_t mnmajor_desc(const unsigned char* rows, int lbo, int kk) {
  return sm90::smem_descriptor(rows + kk * 2048, lbo, 1024);
}

// ---------------------------------------------------------------------------------------------
// 1/3: per padded query row (a warp each): delta = dO . O, lse2 = lse log2(e) (+inf, 0 past Sq),
// and the row's kD floats of the dQ accumulator zeroed (any kD-float slice of a tile's block will
// do: the main kernel adds into all of it).
template <typename T, int kD>
__global__ void __launch_bounds__(256) attention_bwd_preprocess(const Backward<T> p, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int sq_pad = kBM * p.m_tiles;
  const int64_t bh = row / sq_pad;
  const int i = int(row % sq_pad), b = int(bh / p.H), head = int(bh % p.H);
  float4* const acc = reinterpret_cast<float4*>(p.dq_acc + row * kD);
  for (int c = lane; c < kD / 4; c += 32) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum = 0.f, l2 = INFINITY;
  if (i < p.Sq) {  // warp-uniform: every lane reaches the shuffles
    const T* const o = p.out + p.os.head(b, head) + int64_t(i) * p.os.s[2];
    const T* const d = p.dout + p.dos.head(b, head) + int64_t(i) * p.dos.s[2];
    for (int c = lane; c < kD / 8; c += 32) {
      T oe[8], de[8];
      if (p.vec_o) {
        const uint4 v = *reinterpret_cast<const uint4*>(o + 8 * c);
        memcpy(oe, &v, 16);
      } else {
        for (int k = 0; k < 8; ++k) oe[k] = o[8 * c + k];
      }
      if (p.vec_do) {
        const uint4 v = *reinterpret_cast<const uint4*>(d + 8 * c);
        memcpy(de, &v, 16);
      } else {
        for (int k = 0; k < 8; ++k) de[k] = d[8 * c + k];
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += rosetta::to_float(oe[k]) * rosetta::to_float(de[k]);
    }
    sum = rosetta::warp_sum(sum);
    l2 = p.lse[p.ls.head(b, head) + int64_t(i) * p.ls.s[2]] * kLog2e;
  }
  if (lane == 0) {
    p.delta[row] = sum;
    p.lse2[row] = l2;
  }
}

// 3/3: dQ = scale * accumulator as T. One thread a float4 of the accumulator: consumer c's slot
// cc * 128 + tid of a tile's block (c = 0 only at kD = 64) holds that thread's accumulators
// d[4cc .. 4cc + 3]: rows 16w + g (+ 8), columns 64c + 8cc + 2t (+ 1) of the tile.
template <typename T, int kD>
__global__ void __launch_bounds__(256) attention_bwd_postprocess(const Backward<T> p, int64_t slots) {
  const int64_t f = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (f >= slots) return;
  constexpr int kBlockSlots = kBM * kD / 4;
  const int64_t blk = f / kBlockSlots;
  const int rem = int(f % kBlockSlots);
  const int c = rem / 1024, cc = rem % 1024 / 128, tid = rem % 128;
  const int w = tid / 32, g = tid % 32 / 4, t = tid % 4;
  const int mt = int(blk % p.m_tiles), bh = int(blk / p.m_tiles), b = bh / p.H, head = bh % p.H;
  const int i0 = mt * kBM + 16 * w + g, col = 64 * c + 8 * cc + 2 * t;
  const float4 v = reinterpret_cast<const float4*>(p.dq_acc)[f];
  T* const base = p.dq + p.dqs.head(b, head) + col;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = i0 + 8 * h;
    if (i >= p.Sq) continue;
    const float x = (h ? v.z : v.x) * p.scale, y = (h ? v.w : v.y) * p.scale;
    T* const o = base + int64_t(i) * p.dqs.s[2];
    if (p.pairs_dq) {
      *reinterpret_cast<uint32_t*>(o) = am::pack2<T>(x, y);
    } else {
      o[0] = rosetta::from_float<T>(x);
      o[1] = rosetta::from_float<T>(y);
    }
  }
}

// 2/3: dK, dV of 128 keys of one (batch, head), and dQ partial sums over them.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 1)
    attention_bwd_sm90(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                       const Backward<T> p) {
  using C = Config<kD>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  unsigned char* const sK = smem;                           // kD / 64 boxes of kBN rows x 128 bytes
  unsigned char* const sV = sK + C::kKVBytes;
  unsigned char* const sQ = sV + C::kKVBytes;               // stage s at s * kQBytes
  unsigned char* const sdO = sQ + kStages * C::kQBytes;     // stage s at s * kQBytes
  unsigned char* const sDs = sdO + kStages * C::kQBytes;    // 2 buffers (tile parity) of kDsBytes
  unsigned char* const sDq = sDs + 2 * C::kDsBytes;         // consumer c at c * kDqBytes
  float* const sLse = reinterpret_cast<float*>(sDq + kConsumers * C::kDqBytes);  // stage s at s * kBM
  float* const sDelta = sLse + kStages * kBM;
  uint64_t* const full_kv = reinterpret_cast<uint64_t*>(sDelta + kStages * kBM);
  uint64_t* const full = full_kv + 1;
  uint64_t* const empty = full + kStages;

  // Low key blocks first: causal, they see the most query tiles.
  const int n_tile = int(blockIdx.x % p.n_tiles);
  const int bh = int(blockIdx.x / p.n_tiles), b = bh / p.H, head = bh % p.H;
  const int n0 = n_tile * kBN;
  // Causal: queries before n0 see none of these keys (n0 is a multiple of kBM).
  const int m_begin = p.causal ? n0 / kBM : 0;
  const int iters = max(p.m_tiles - m_begin, 0);

  if (threadIdx.x == 0) {
    sm90::mbarrier_init(full_kv, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);           // the producer's expect_tx, then the bytes
      sm90::mbarrier_init(&empty[s], kConsumers);  // one arrival per consumer warpgroup
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::set_max_registers<kProducerRegs>();
    if (threadIdx.x == 0 && iters > 0) {
      // Keys past Sk and queries past Sq read as zeros; their bytes still count.
      sm90::mbarrier_arrive_expect_tx(full_kv, 2 * C::kKVBytes);
      for (int j = 0; j < kD / 64; ++j) {
        a90::tma_load_4d(sK + j * (kBN * 128), &map_k, full_kv, 64 * j, n0, head, b);
        a90::tma_load_4d(sV + j * (kBN * 128), &map_v, full_kv, 64 * j, n0, head, b);
      }
      const int64_t vec0 = int64_t(bh) * p.m_tiles * kBM;  // this head's lse2 / delta
      for (int it = 0; it < iters; ++it) {
        const int s = it % kStages, m0 = (m_begin + it) * kBM;
        // Fill f = it / kStages of a stage waits for both consumers' release of fill f - 1.
        sm90::mbarrier_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        sm90::mbarrier_arrive_expect_tx(&full[s], 2 * C::kQBytes + 2 * C::kVecBytes);
        for (int j = 0; j < kD / 64; ++j) {
          a90::tma_load_4d(sQ + s * C::kQBytes + j * (kBM * 128), &map_q, &full[s], 64 * j, m0, head, b);
          a90::tma_load_4d(sdO + s * C::kQBytes + j * (kBM * 128), &map_do, &full[s], 64 * j, m0, head, b);
        }
        sm90::bulk_load(sLse + s * kBM, p.lse2 + vec0 + m0, C::kVecBytes, &full[s]);
        sm90::bulk_load(sDelta + s * kBM, p.delta + vec0 + m0, C::kVecBytes, &full[s]);
      }
    }
    return;
  }

  sm90::set_max_registers<kConsumerRegs>();
  const int c = wg - 1;  // consumer 0 or 1: keys n0 + 64c ..
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4;
  const int key_g = n0 + 64 * c + 16 * warp + g;  // this thread's keys: key_g, key_g + 8
  const int col_t = 2 * (lane % 4);
  const unsigned char* const k_rows = sK + c * (64 * 128);  // this consumer's 64 rows in every box
  const unsigned char* const v_rows = sV + c * (64 * 128);
  unsigned char* const dq_buf = sDq + c * C::kDqBytes;
  // dQ = dS K: D = 128: columns 64c .. (K's box c) over all kBN keys; D = 64: all columns over
  // this consumer's keys (rows 64c .. of dS^T and of K's one box).
  constexpr int kDqSlices = kD == 128 ? kBN / 16 : 64 / 16;
  const int dq_a_off = kD == 128 ? 0 : c * (64 * 128);
  const int dq_b_off = kD == 128 ? c * (kBN * 128) : c * (64 * 128);
  float* const dq_acc = p.dq_acc + int64_t(bh) * p.m_tiles * (kBM * kD) + (kD == 128 ? c * (64 * 64) : 0);

  float dk[kD / 2], dv[kD / 2];  // rows: this consumer's 64 keys, columns: d
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.f;

  if (iters > 0) sm90::mbarrier_wait(full_kv, 0);
  for (int it = 0; it < iters; ++it) {
    const int s = it % kStages, mt = m_begin + it, m0 = mt * kBM;
    const unsigned char* const q_tile = sQ + s * C::kQBytes;
    const unsigned char* const do_tile = sdO + s * C::kQBytes;
    unsigned char* const ds_tile = sDs + (it % 2) * C::kDsBytes;
    const float* const lse_s = sLse + s * kBM;
    const float* const delta_s = sDelta + s * kBM;
    sm90::mbarrier_wait(&full[s], (it / kStages) & 1);

    // S^T = K_c Q^T, dP^T = V_c dO^T: two groups in flight.
    float st[32], dpt[32];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss_n64<T, false, false>(st, kmajor_desc(k_rows, kBN * 128, kk), kmajor_desc(q_tile, kBM * 128, kk),
                                    kk > 0);
    sm90::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss_n64<T, false, false>(dpt, kmajor_desc(v_rows, kBN * 128, kk), kmajor_desc(do_tile, kBM * 128, kk),
                                    kk > 0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();  // S^T done; dP^T runs on under the exponentials
    sm90::fence_accumulators(st);

    // P^T: column (query) 8cc + col_t + e, row (key) key_g + 8h. Queries past Sq have lse2 = +inf
    // (P = 0); keys past Sk (zero rows of K: P = exp2(-lse2), maybe inf) and, causal, keys past
    // the query are set to 0 on the tiles that reach them.
    const bool edge = n0 + 64 * c + 64 > p.Sk || (p.causal && n0 + 64 * c + 63 > m0);
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
      const float2 l = *reinterpret_cast<const float2*>(lse_s + 8 * cc + col_t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st[4 * cc + 2 * h] = a90::exp2_approx(fmaf(st[4 * cc + 2 * h], p.scale_log2, -l.x));
        st[4 * cc + 2 * h + 1] = a90::exp2_approx(fmaf(st[4 * cc + 2 * h + 1], p.scale_log2, -l.y));
      }
    }
    if (edge) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int key = key_g + 8 * ((i / 2) & 1), q = m0 + 8 * (i / 4) + col_t + (i & 1);
        if (key >= p.Sk || (p.causal && key > q)) st[i] = 0.f;
      }
    }
    // P^T's k slice kk (queries 16kk ..) is accumulator columns 16kk .. 16kk + 15: the A fragment
    // a[r] = the pair st[8kk + 2r], st[8kk + 2r + 1] (as the forward's P).
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = am::pack2<T>(st[8 * kk + 2 * r], st[8 * kk + 2 * r + 1]);
    // dV += P^T dO: dO's rows are the k index (MN-major, LBO one 64-d box).
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) a90::wgmma_rs<T, kD>(dv, pa[kk], mnmajor_desc(do_tile, kBM * 128, kk));
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();  // dP^T done; dV runs on
    sm90::fence_accumulators(dpt);

    // dS^T = P^T (dP^T - delta), in place of dP^T (fp32 P).
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) {
      const float2 dl = *reinterpret_cast<const float2*>(delta_s + 8 * cc + col_t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        dpt[4 * cc + 2 * h] = st[4 * cc + 2 * h] * (dpt[4 * cc + 2 * h] - dl.x);
        dpt[4 * cc + 2 * h + 1] = st[4 * cc + 2 * h + 1] * (dpt[4 * cc + 2 * h + 1] - dl.y);
      }
    }
    uint32_t dsa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) dsa[kk][r] = am::pack2<T>(dpt[8 * kk + 2 * r], dpt[8 * kk + 2 * r + 1]);
    // dS^T to shared memory, 128B-swizzled rows of 64 queries: dsa[kk][r] is row (key) 64c + 16w
    // + g + 8(r & 1), columns 8(2kk + (r >> 1)) + col_t, +1: 16-byte chunk 2kk + (r >> 1), XOR
    // the row's phase g (64c + 16w + 8h is a multiple of 8). A warp's 32 stores hit 32 banks.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = 64 * c + 16 * warp + g + 8 * (r & 1), chunk = 2 * kk + (r >> 1);
        *reinterpret_cast<uint32_t*>(ds_tile + row * 128 + ((chunk ^ g) << 4) + 2 * col_t) = dsa[kk][r];
      }
    sm90::fence_proxy_async_shared();  // visible to the dQ wgmma (async proxy) after the barrier
    // dK += dS^T Q: Q's rows are the k index.
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) a90::wgmma_rs<T, kD>(dk, dsa[kk], mnmajor_desc(q_tile, kBM * 128, kk));
    sm90::wgmma_commit();

    // The last tile's reduce-add has read dq_buf (before this barrier, so before any thread
    // writes it again below), and dS^T of this tile is complete for the dQ wgmma.
    if (tid == 0) sm90::tma_store_wait_read<0>();
    if constexpr (kD == 128) sm90::named_barrier(kDsBarrier, 256);
    else sm90::named_barrier(kDsBarrier + c, 128);
    // dQ_partial = dS K: A = dS (queries x keys) read from dS^T (MN-major), B = K (keys x d,
    // MN-major). dS^T is double-buffered: a consumer writes buffer it % 2 only after passing this
    // barrier of tile it - 1, which the other consumer reached after its tile it - 2 dQ wgmma
    // (the last reader of that buffer) had completed.
    float dq[32];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqSlices; ++kk)
      wgmma_ss_n64<T, true, true>(dq, mnmajor_desc(ds_tile + dq_a_off, 64 * 128, kk),
                                  mnmajor_desc(sK + dq_b_off, kBN * 128, kk), kk > 0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();  // dV, dK done: the stage's Q, dO, lse2, delta are free
    sm90::fence_accumulators(dv);
    sm90::fence_accumulators(dk);
    if (tid == 0) sm90::mbarrier_arrive(&empty[s]);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(dq);

    // dQ_partial to shared memory in fragment order (slot cc * 128 + tid: a warp's float4 stores
    // are 512 contiguous bytes), then one reduce-add of the 16 KB into the tile's block.
    float4* const buf = reinterpret_cast<float4*>(dq_buf);
#pragma unroll
    for (int cc = 0; cc < 8; ++cc)
      buf[cc * 128 + tid] = make_float4(dq[4 * cc], dq[4 * cc + 1], dq[4 * cc + 2], dq[4 * cc + 3]);
    sm90::fence_proxy_async_shared();
    sm90::named_barrier(kDqBarrier + c, 128);
    if (tid == 0) {
      bulk_reduce_add(dq_acc + int64_t(mt) * (kBM * kD), dq_buf, C::kDqBytes);
      sm90::tma_store_commit();
    }
  }

  // dK (scaled), dV through this consumer's dQ buffer once its last reduce-add is done (tid 0's
  // wait, published by the barrier). Rows past Sk are not stored.
  if (tid == 0) sm90::tma_store_wait();
  sm90::named_barrier(kDqBarrier + c, 128);
  T* const tile = reinterpret_cast<T*>(dq_buf);
  const int grow0 = n0 + 64 * c + 16 * warp;
  const float scale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  am::store_rows<kD>(tile, 16 * warp, reinterpret_cast<const float(&)[kD / 8][4]>(dk), scale,
                     p.dk + p.dks.head(b, head), p.dks.s[2], grow0, p.Sk, p.vec_dk, lane);
  am::store_rows<kD>(tile, 16 * warp, reinterpret_cast<const float(&)[kD / 8][4]>(dv), one,
                     p.dv + p.dvs.head(b, head), p.dvs.s[2], grow0, p.Sk, p.vec_dv, lane);
}

// 16-byte accesses of a tensor's rows are legal when its base and every row start are 16-byte
// aligned; 4-byte pairs when they are 4-byte aligned.
inline bool vec_ok(const rosetta::Tensor& t, int elems) {
  bool ok = reinterpret_cast<uintptr_t>(t.data) % (2 * elems) == 0;
  for (int d = 0; d < 3; ++d) ok = ok && (t.size[d] == 1 || t.stride[d] % elems == 0);
  return ok;
}

template <typename F> void with_head_dim(int64_t d, F&& f) {
  if (d == 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

cudaError_t backward(const rosetta::AttentionBackwardArgs& a, cudaStream_t stream) {
  const int64_t B = a.q.size[0], H = a.q.size[1], Sq = a.q.size[2], D = a.q.size[3], Sk = a.k.size[2];
  if (D != 64 && D != 128) return cudaErrorInvalidValue;
  if (Sq > INT_MAX || Sk > INT_MAX || H > INT_MAX) return cudaErrorInvalidValue;
  if (B * H == 0) return cudaSuccess;
  if (Sk == 0) return Sq == 0 ? cudaSuccess : cudaErrorInvalidValue;
  const int64_t m_tiles = rosetta::ceil_div(Sq, kBM), n_tiles = rosetta::ceil_div(Sk, kBN);
  const int64_t rows = B * H * m_tiles * kBM, blocks = n_tiles * B * H;
  const int64_t pre_blocks = rosetta::ceil_div(rows, 8), post_blocks = rosetta::ceil_div(rows * D / 4, 256);
  if (blocks > INT_MAX || pre_blocks > INT_MAX || post_blocks > INT_MAX || m_tiles * kBM > INT_MAX)
    return cudaErrorInvalidValue;
  int device = 0;  // bind the device's primary context for the encoder (as the forward)
  cudaGetDevice(&device);
  cudaSetDevice(device);
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.q.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (Sq == 0) {  // no queries: dK = dV = 0
      rosetta::attn::zero_heads<T>(a.dk, B * H, Sk, int(D), stream);
      rosetta::attn::zero_heads<T>(a.dv, B * H, Sk, int(D), stream);
      return;
    }
    CUtensorMap map_q{}, map_k{}, map_v{}, map_do{};
    if (!a90::encode_heads_map<T>(map_q, a.q, kBM) || !a90::encode_heads_map<T>(map_k, a.k, kBN) ||
        !a90::encode_heads_map<T>(map_v, a.v, kBN) || !a90::encode_heads_map<T>(map_do, a.dout, kBM)) {
      status = cudaErrorInvalidValue;
      return;
    }
    float* const lse2 = a.workspace.get<float>(rows);
    float* const delta = a.workspace.get<float>(rows);
    float* const dq_acc = a.workspace.get<float>(rows * D);
    const Backward<T> p{a.out.ptr<const T>(), a.dout.ptr<const T>(), a.lse.ptr<const float>(), lse2, delta, dq_acc,
                        a.dq.ptr<T>(), a.dk.ptr<T>(), a.dv.ptr<T>(), strides_of(a.out), strides_of(a.dout),
                        strides_of(a.lse), strides_of(a.dq), strides_of(a.dk), strides_of(a.dv), int(H), int(Sq),
                        int(Sk), int(m_tiles), int(n_tiles), a.causal ? 1 : 0, float(a.scale),
                        float(a.scale * 1.4426950408889634), vec_ok(a.out, 8), vec_ok(a.dout, 8), vec_ok(a.dk, 8),
                        vec_ok(a.dv, 8), vec_ok(a.dq, 2)};
    with_head_dim(D, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      constexpr int kSmem = Config<kD>::kSmemBytes;
      attention_bwd_preprocess<T, kD><<<unsigned(pre_blocks), 256, 0, stream>>>(p, rows);
      cudaFuncSetAttribute(attention_bwd_sm90<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      attention_bwd_sm90<T, kD><<<unsigned(blocks), kThreads, kSmem, stream>>>(map_q, map_k, map_v, map_do, p);
      attention_bwd_postprocess<T, kD><<<unsigned(post_blocks), 256, 0, stream>>>(p, rows * kD / 4);
    });
  });
  return status != cudaSuccess ? status : launched;
}

}  // namespace
}  // namespace rosetta::attention_sm90_bwd
