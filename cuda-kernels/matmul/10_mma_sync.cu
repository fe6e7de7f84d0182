/*
Step 10 — mma.sync from ldmatrix over XOR-swizzled shared memory, cp.async pipeline
Changed:  wmma gives way to the PTX it compiles to: mma.sync.m16n8k16 (HMMA.16816) fed by
          ldmatrix.x4 (LDSM), whose register layout we now know and schedule. Shared tiles are
          128 x 64 (A) and 64 x 128 (B) with 128-byte-or-wider rows, unpadded: 16-byte chunk c of
          row r is stored at chunk c ^ (r % 8), so the 8 row addresses of every ldmatrix phase
          fall in 8 different bank groups. Step 8's cp.async ring (3 stages, zero-fill through
          src-size) fills them; an operand whose pointer or row stride is not 16-byte aligned
          is gathered by scalar loads into the same swizzled slots. 4 warps of 64 x 64 each.
Why:      step 9 waited for global memory at every tile and read fragments through wmma's
          generic loads. Now 2 tiles are in flight while one is computed, and per 16-wide k
          slice a warp issues 8 LDSM.x4 (4 KB of shared memory) for 32 HMMA.16816 (131 kflop):
          32 flop per shared byte, against 21 for step 9's 64 x 32 warp tile (3 KB, 65 kflop).
          Block tile intensity 64 flop/B as before; 2 blocks (8 warps) per SM, 96 KB each.
          mma.sync cannot reach Hopper's full tensor rate (only wgmma can).
Still:    the register file is the staging area of every operand (LDSM then HMMA), and the
          warp-synchronous HMMA cannot reach Hopper's tensor peak. Step 11 hands whole tiles to
          the copy engine (TMA) and the warpgroup MMA (wgmma), which reads shared memory itself.
Limits:   M, N, K < 2^31.
Dtypes:   bfloat16, float16
Layout:   rows
*/
#include <cstring>
#include <type_traits>

#include "matmul.cuh"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3;
constexpr int kWarpsM = 2, kWarpsN = 2, kThreads = 32 * kWarpsM * kWarpsN;  // 128
constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;               // 64 x 64
constexpr int kMmaM = kWarpM / 16, kMmaN = kWarpN / 8;                      // 4 x 8 mma tiles
constexpr int kChunksA = kBM * kBK / 8, kChunksB = kBK * kBN / 8;          // 16-byte chunks
constexpr int kStageElems = kBM * kBK + kBK * kBN;
constexpr int kSmemBytes = kStages * kStageElems * 2;                       // 96 KB
constexpr int kGroupM = 8;
static_assert(kBK * 2 == 128 && kBN * 2 >= 128,
              "rows of at least 8 chunks: the XOR swizzle permutes chunks 0-7 of each 128 bytes");
static_assert(kChunksA % kThreads == 0 && kChunksB % kThreads == 0, "whole chunks per thread");

template <typename T>
struct Problem {
  const T* __restrict__ a;
  const T* __restrict__ b;
  T* __restrict__ out;
  int M, N, K;
  int64_t lda, ldb;
  bool vec_a, vec_b, pair_out;  // cp.async allowed (16-byte aligned rows); 4-byte output pairs
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of 16-byte chunk `chunk` of row `row` in a tile with `row_elems` per row. The
// swizzle flips the low 3 bits of the chunk index with the row's low 3 bits: rows r..r+7 at the
// same logical chunk land in 8 distinct 16-byte columns of a 128-byte line, i.e. all 32 banks.
__device__ __forceinline__ int swizzle(int row, int chunk, int row_elems) {
  return row * row_elems + ((chunk ^ (row % 8)) * 8);
}

// Chunk src[0..7] (the first `valid` exist, <= 0: none) into the 16-byte slot dst. vec: cp.async
// copies 2 * valid bytes and zero-fills the rest (src must then be 16-byte aligned; with
// valid <= 0 it reads nothing, and src is a valid base pointer). Otherwise scalar loads and one
// 16-byte shared store, synchronous, into the same slot.
template <typename T>
__device__ __forceinline__ void load_chunk(T* dst, const T* src, const T* base, int valid, bool vec) {
  if (vec) {
    const int bytes = 2 * max(0, min(valid, 8));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(bytes > 0 ? src : base), "r"(bytes) : "memory");
  } else {
    T v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = e < valid ? src[e] : rosetta::from_float<T>(0.f);
    uint4 packed;
    memcpy(&packed, v, 16);
    *reinterpret_cast<uint4*>(dst) = packed;
  }
}

template <typename T>
__device__ __forceinline__ void load_tile(const Problem<T>& p, T* as, T* bs, int m0, int n0, int k0) {
#pragma unroll
  for (int i = 0; i < kChunksA / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads, r = c / (kBK / 8), ch = c % (kBK / 8);
    const int64_t m = m0 + r;  // 8 consecutive threads read one 128-byte row piece: coalesced
    load_chunk(as + swizzle(r, ch, kBK), p.a + m * p.lda + k0 + ch * 8, p.a,
               m < p.M ? p.K - (k0 + ch * 8) : 0, p.vec_a);
  }
#pragma unroll
  for (int i = 0; i < kChunksB / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads, r = c / (kBN / 8), ch = c % (kBN / 8);
    const int64_t k = k0 + r;
    load_chunk(bs + swizzle(r, ch, kBN), p.b + k * p.ldb + n0 + ch * 8, p.b,
               k < p.K ? p.N - (n0 + ch * 8) : 0, p.vec_b);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2) matmul_mma_sync(Problem<T> p) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* const tiles = reinterpret_cast<T*>(smem);  // per stage: A (kBM x kBK) then B (kBK x kBN)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = (warp / kWarpsN) * kWarpM, wn = (warp % kWarpsN) * kWarpN;
  int tm, tn;
  rosetta::tile_coords<kGroupM>((p.M + kBM - 1) / kBM, (p.N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * kBM, n0 = tn * kBN;
  const int k_tiles = (p.K + kBK - 1) / kBK;

  float acc[kMmaM][kMmaN][4] = {};

  // Prologue: tiles 0 .. kStages-2 in flight. One commit group per tile, even an empty one, so
  // that "wait until at most kStages-2 groups are pending" always means "tile kt has landed".
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(p, tiles + s * kStageElems, tiles + s * kStageElems + kBM * kBK, m0, n0, s * kBK);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    // Tile kt is visible to all warps, and every warp has finished computing tile kt-1, whose
    // stage the copy below overwrites.
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) {
      T* st = tiles + (next % kStages) * kStageElems;
      load_tile(p, st, st + kBM * kBK, m0, n0, next * kBK);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");

    const T* as = tiles + (kt % kStages) * kStageElems;
    const T* bs = as + kBM * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // A fragments (ldmatrix.x4, row-major 16 x 16): lanes 0-15 address rows 0-15 at k chunk
      // 2kk, lanes 16-31 the same rows at chunk 2kk + 1: registers a0..a3 = (rows 0-7, k 0-7),
      // (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15), mma's A order.
      uint32_t a[kMmaM][4];
#pragma unroll
      for (int i = 0; i < kMmaM; ++i) {
        const int r = wm + 16 * i + lane % 16;
        ldmatrix_x4(a[i], as + swizzle(r, 2 * kk + lane / 16, kBK));
      }
      // B fragments: B is k-major rows of n in shared memory, mma wants each lane's two k
      // neighbours of one n column: ldmatrix .trans. Lanes 0-7 address k rows 0-7, lanes 8-15
      // rows 8-15 (both n chunk j), lanes 16-31 the same at n chunk j + 1: b0/b1 of two n8 tiles.
      uint32_t b[kMmaN][2];
#pragma unroll
      for (int j = 0; j < kMmaN / 2; ++j) {
        const int r = 16 * kk + lane % 16;
        uint32_t t[4];
        ldmatrix_x4_trans(t, bs + swizzle(r, (wn + 16 * j) / 8 + lane / 16, kBN));
        b[2 * j][0] = t[0];
        b[2 * j][1] = t[1];
        b[2 * j + 1][0] = t[2];
        b[2 * j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < kMmaM; ++i)
#pragma unroll
        for (int j = 0; j < kMmaN; ++j) mma_16816<T>(acc[i][j], a[i], b[j][0], b[j][1]);
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // no copy outlives the block

  // Accumulator layout of m16n8: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and +1.
#pragma unroll
  for (int i = 0; i < kMmaM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + wm + 16 * i + lane / 4 + 8 * h;
      if (m >= p.M) continue;
      T* row = p.out + int64_t(m) * p.N;  // int64: m * N passes 2^31 for big outputs
#pragma unroll
      for (int j = 0; j < kMmaN; ++j) {
        const int n = n0 + wn + 8 * j + 2 * (lane % 4);
        const T v[2] = {rosetta::from_float<T>(acc[i][j][2 * h]), rosetta::from_float<T>(acc[i][j][2 * h + 1])};
        if (p.pair_out && n + 1 < p.N) {
          uint32_t packed;
          memcpy(&packed, v, 4);
          *reinterpret_cast<uint32_t*>(row + n) = packed;
        } else {
          if (n < p.N) row[n] = v[0];
          if (n + 1 < p.N) row[n + 1] = v[1];
        }
      }
    }
  }
}

}  // namespace

cudaError_t matmul_10_mma_sync(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.b.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  return rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (K == 0) {  // the empty sum: zeros (all-zero bits are +0 in bf16 and fp16)
      cudaMemsetAsync(args.out.data, 0, M * N * int64_t(sizeof(T)), stream);
      return;
    }
    const int64_t lda = args.a.stride[0], ldb = args.b.stride[0];
    const Problem<T> p{args.a.ptr<const T>(), args.b.ptr<const T>(), args.out.ptr<T>(), int(M), int(N), int(K),
                       lda, ldb, rosetta::aligned16(args.a.data) && lda % 8 == 0,
                       rosetta::aligned16(args.b.data) && ldb % 8 == 0,
                       reinterpret_cast<uintptr_t>(args.out.data) % 4 == 0 && N % 2 == 0};
    cudaFuncSetAttribute(matmul_mma_sync<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    const int64_t blocks = rosetta::ceil_div(M, kBM) * rosetta::ceil_div(N, kBN);
    matmul_mma_sync<T><<<blocks, kThreads, kSmemBytes, stream>>>(p);
  });
}
