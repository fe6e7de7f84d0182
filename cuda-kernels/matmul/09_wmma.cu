/*
Step 9 — tensor cores through nvcuda::wmma (bf16/fp16 in, fp32 accumulate)
Changed:  the inputs become 16-bit (bf16 or fp16) and the multiply-adds move from FFMA to the
          tensor cores: each warp owns a 64 x 32 tile of out as 4 x 2 wmma 16 x 16 fp32
          accumulator fragments and, per 16-wide k slice, loads 4 A and 2 B fragments from
          shared memory (wmma::load_matrix_sync) and issues 8 wmma::mma_sync (HMMA in SASS).
          Block tile 128 x 128 x 32, 8 warps; tiles are staged in shared memory by plain 16-byte
          loads (scalar, zero-filled ones at the edges or when a pointer or row stride is not
          16-byte aligned); rows padded by 16 bytes against bank conflicts. Grouped tile order.
Why:      step 8 tops out near the FP32 FMA peak (~60 TFLOP/s). One HMMA.16816 does 4096 flops
          where an FFMA does 2: the dense bf16/fp16 tensor peak is ~990 TFLOP/s (cuBLAS reaches
          ~740). A 128 x 128 tile with 16-bit operands needs 2 * 128 * 128 / ((128 + 128) * 2 B)
          = 64 flop per byte fetched, enough for L2 (~7 TB/s sustained x 64 = ~450 TFLOP/s).
          But each tile is loaded synchronously (global latency fully exposed between two
          barriers, only ~1-2 blocks per SM to cover it) and wmma's opaque fragments hide the
          register layout, so loads cannot be scheduled around the HMMAs.
Still:    no copy/compute overlap, padded (not swizzled) shared rows and wmma's generic
          fragment loads. Step 10 drives mma.sync directly from ldmatrix over XOR-swizzled
          shared memory filled by a cp.async pipeline.
Limits:   M, N, K < 2^31.
Dtypes:   bfloat16, float16
Layout:   rows
*/
#include <cstring>
#include <mma.h>

#include "matmul.cuh"

namespace {

using namespace nvcuda;

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = 32 * kWarpsM * kWarpsN;  // 256
constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;               // 64 x 32
constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 16;                 // 4 x 2
constexpr int kPad = 8;  // 16 bytes: consecutive rows start 4 banks apart (80 / 272-byte rows)
constexpr int kGroupM = 8;
static_assert(kBM * kBK / 8 == 2 * kThreads && kBK * kBN / 8 == 2 * kThreads,
              "two 16-byte chunks of A and two of B per thread per tile");
static_assert(((kBK + kPad) * 2) % 16 == 0 && ((kBN + kPad) * 2) % 16 == 0,
              "wmma::load_matrix_sync needs ldm a multiple of 8 16-bit elements");

template <typename T>
struct Problem {
  const T* __restrict__ a;
  const T* __restrict__ b;
  T* __restrict__ out;
  int M, N, K;
  int64_t lda, ldb;
  bool vec_a, vec_b, vec_out;  // 16-byte paths allowed (pointer and row stride aligned)
};

// Eight consecutive elements src[0..7] of a row of which the first `valid` exist (<= 0: none)
// into dst; the rest are zero so tail tiles add nothing to the sums.
template <typename T>
__device__ __forceinline__ void load8(T* dst, const T* src, int valid, bool vec) {
  if (vec && valid >= 8) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = e < valid ? src[e] : rosetta::from_float<T>(0.f);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) matmul_wmma(Problem<T> p) {
  // load_matrix_sync wants 32-byte aligned fragment pointers: rows of 80 and 272 bytes, fragment
  // offsets of 16 rows and 16 columns (32 bytes) keep every one aligned.
  __shared__ __align__(128) T as[kBM][kBK + kPad];
  __shared__ __align__(128) T bs[kBK][kBN + kPad];
  __shared__ __align__(128) float cs[kThreads / 32][16][16];  // per-warp epilogue staging

  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int wm = (warp / kWarpsN) * kWarpM, wn = (warp % kWarpsN) * kWarpN;
  int tm, tn;
  rosetta::tile_coords<kGroupM>((p.M + kBM - 1) / kBM, (p.N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * kBM, n0 = tn * kBN;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragsM][kFragsN];
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  for (int k0 = 0; k0 < p.K; k0 += kBK) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int c = t + r * kThreads;
      const int am = c / (kBK / 8), ak = (c % (kBK / 8)) * 8;  // A: row am, 8 k from ak
      const int bk = c / (kBN / 8), bn = (c % (kBN / 8)) * 8;  // B: row bk, 8 n from bn
      const int64_t arow = m0 + am, brow = k0 + bk;
      load8(&as[am][ak], p.a + arow * p.lda + k0 + ak, arow < p.M ? p.K - (k0 + ak) : 0, p.vec_a);
      load8(&bs[bk][bn], p.b + brow * p.ldb + n0 + bn, brow < p.K ? p.N - (n0 + bn) : 0, p.vec_b);
    }
    __syncthreads();  // the tile is complete before any warp reads fragments of it
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af[kFragsM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bf[kFragsN];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) wmma::load_matrix_sync(af[i], &as[wm + 16 * i][kk], kBK + kPad);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) wmma::load_matrix_sync(bf[j], &bs[kk][wn + 16 * j], kBN + kPad);
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
    }
    __syncthreads();  // every warp is done reading before the next tile overwrites as/bs
  }

  // Epilogue: the accumulator layout is opaque, so each fragment goes through the warp's 16 x 16
  // fp32 staging square; lane l then converts and stores row l / 2, columns 8 (l % 2) .. + 7.
  float(*stage)[16] = cs[warp];
  const int r = lane / 2, c = (lane % 2) * 8;
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
      wmma::store_matrix_sync(&stage[0][0], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();  // the fragment is in shared memory before lanes read other lanes' parts
      const int m = m0 + wm + 16 * i + r, n = n0 + wn + 16 * j + c;
      if (m < p.M) {
        T v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = rosetta::from_float<T>(stage[r][c + e]);
        T* dst = p.out + int64_t(m) * p.N + n;  // int64: m * N passes 2^31 for big outputs
        if (p.vec_out && n + 8 <= p.N) {
          uint4 packed;
          memcpy(&packed, v, sizeof(packed));
          *reinterpret_cast<uint4*>(dst) = packed;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (n + e < p.N) dst[e] = v[e];
        }
      }
      __syncwarp();  // all lanes have read the square before the next fragment overwrites it
    }
  }
}

}  // namespace

cudaError_t matmul_09_wmma(const rosetta::MatmulArgs& args, cudaStream_t stream) {
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
                       rosetta::aligned16(args.out.data) && N % 8 == 0};
    const int64_t blocks = rosetta::ceil_div(M, kBM) * rosetta::ceil_div(N, kBN);
    matmul_wmma<T><<<blocks, kThreads, 0, stream>>>(p);
  });
}
