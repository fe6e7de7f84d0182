// Pieces of the fp32 matmul ladder (cuda-kernels/matmul/) shared once a step has taught them:
//   MatmulProblem, matmul_launch   every step: shape checks, M or N == 0, K == 0 (step 1)
//   vec4_ok, with_vec4_paths, load4  128-bit global loads with a scalar path (step 6)
//   tile_coords                    grouped tile order for L2 reuse (step 7)
//   ThreadTile                     the warp -> thread register tile, its FMAs and stores (step 7)
// out = a @ b with a: M x K and b: K x N row-major (row strides lda, ldb; the last stride is 1),
// out: M x N contiguous.
#pragma once

#include <climits>
#include <type_traits>

#include "primitives.cuh"

namespace rosetta {

struct MatmulProblem {
  const float* __restrict__ a;
  const float* __restrict__ b;
  float* __restrict__ out;
  int M, N, K;
  int64_t lda, ldb;  // row strides in elements (int64: row * ld can pass 2^31)
};

// The launcher prologue every step shares: dims that fit an int, nothing to launch for M or N == 0,
// zeros for K == 0 (the empty sum), else launch(problem). fp32 only (the steps' `Dtypes:` line).
template <typename Launch>
cudaError_t matmul_launch(const MatmulArgs& p, cudaStream_t stream, Launch&& launch) {
  const int64_t M = p.a.size[0], K = p.a.size[1], N = p.b.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  return dispatch_dtype(p.a.dtype, [&](auto) {
    if (K == 0) {
      cudaMemsetAsync(p.out.data, 0, M * N * int64_t(sizeof(float)), stream);  // error: cudaGetLastError
      return;
    }
    launch(MatmulProblem{p.a.ptr<const float>(), p.b.ptr<const float>(), p.out.ptr<float>(), int(M),
                         int(N), int(K), p.a.stride[0], p.b.stride[0]});
  });
}

// A 16-byte path for one operand needs its base 16-byte aligned AND its row stride a multiple of
// 4 floats: then every row start (and every 4th element of it) is aligned too.
inline bool vec4_ok(const void* p, int64_t ld) { return aligned16(p) && ld % 4 == 0; }

// Calls f(bool_constant<vec_a>, bool_constant<vec_b>): the launcher picks one of four kernel
// instantiations, so the 16-byte or scalar path of each operand is fixed at compile time.
template <typename F> void with_vec4_paths(bool vec_a, bool vec_b, F&& f) {
  using Y = std::true_type;
  using N = std::false_type;
  if (vec_a) vec_b ? f(Y{}, Y{}) : f(Y{}, N{});
  else vec_b ? f(N{}, Y{}) : f(N{}, N{});
}

// Four consecutive floats of a row, p[0..3], of which the first `valid` exist (<= 0: none); the
// rest read as 0 (the zero-filled tile edge). kVec: p is 16-byte aligned, so a full group is
// one 128-bit load; a partial group never reads past the row's end.
template <bool kVec>
__device__ __forceinline__ float4 load4(const float* p, int valid) {
  if (kVec && valid >= 4) return *reinterpret_cast<const float4*>(p);
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (valid > 0) v.x = p[0];
  if (valid > 1) v.y = p[1];
  if (valid > 2) v.z = p[2];
  if (valid > 3) v.w = p[3];
  return v;
}

// Block index -> (tile row, tile column), walking kGroupM tile rows column by column, so blocks
// resident together share a few rows of a and a few columns of b in L2 (Triton's GROUP_M order):
// a wave of W blocks reads ~kGroupM row panels of a and W / kGroupM column panels of b, instead
// of W / tiles_n rows of a and every column panel of b.
// `index` is the tile's place in that order (blockIdx.x unless a step schedules tiles itself).
template <int kGroupM>
__device__ __forceinline__ void tile_coords(int index, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = kGroupM * tiles_n;
  const int group = index / per_group;
  const int first_m = group * kGroupM;
  const int rows = min(tiles_m - first_m, kGroupM);  // the last group may be short
  const int in_group = index - group * per_group;
  tm = first_m + in_group % rows;
  tn = in_group / rows;
}
template <int kGroupM>
__device__ __forceinline__ void tile_coords(int tiles_m, int tiles_n, int& tm, int& tn) {
  tile_coords<kGroupM>(blockIdx.x, tiles_m, tiles_n, tm, tn);
}

// The register tile of one thread in a 64 x 64 warp tile (step 7): the 32 lanes form 8 rows x 4
// columns; lane (r, c) owns the rows {32i + 4r + ii} (i < 2, ii < 4) and the columns
// {16j + 4c + jj} (j < 4, jj < 4): an 8 x 16 tile of accumulators in 4-wide pieces, so each
// k-step is 2 + 4 128-bit shared loads for 128 FFMAs. A warp's A load then reads 8 distinct
// 16-byte pieces (128 contiguous bytes) and its B load 4 pieces, each broadcast to 8 lanes: no
// bank conflicts.
struct ThreadTile {
  static constexpr int kWarpM = 64, kWarpN = 64, kM = 8, kN = 16;
  float acc[kM][kN];
  int row, col;  // the lane's offset inside the warp tile: 4r, 4c

  __device__ __forceinline__ explicit ThreadTile(int lane) : row(4 * (lane / 4)), col(4 * (lane % 4)) {
#pragma unroll
    for (int i = 0; i < kM; ++i)
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[i][j] = 0.f;
  }

  // The operands of one k-step, held in registers.
  struct Fragment {
    float a[kM], b[kN];
  };

  // as points at the warp's 64 A values of one k (transposed A: contiguous in m), bs at its 64 B
  // values. 16-byte aligned: row, col and the warp offsets are multiples of 4.
  __device__ __forceinline__ void load(Fragment& f, const float* as, const float* bs) const {
#pragma unroll
    for (int i = 0; i < kM / 4; ++i)
      *reinterpret_cast<float4*>(&f.a[4 * i]) = *reinterpret_cast<const float4*>(as + 32 * i + row);
#pragma unroll
    for (int j = 0; j < kN / 4; ++j)
      *reinterpret_cast<float4*>(&f.b[4 * j]) = *reinterpret_cast<const float4*>(bs + 16 * j + col);
  }

  __device__ __forceinline__ void fma(const Fragment& f) {
#pragma unroll
    for (int i = 0; i < kM; ++i)
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[i][j] = fmaf(f.a[i], f.b[j], acc[i][j]);
  }

  // The same FFMAs column by column, every other column's rows in reverse (step 8). An FFMA
  // whose operand repeats the previous FFMA's in the same slot reads it from the operand reuse
  // cache instead of the register file: here b[j] repeats for 8 FFMAs and a[i] across each turn,
  // so fewer register-file reads contend for its banks. Which columns go first changes how ptxas
  // assigns registers, and with it the bank conflicts left: starting at the middle column
  // measured best of the orders tried (see step 8's header).
  __device__ __forceinline__ void fma_by_columns(const Fragment& f) {
#pragma unroll
    for (int c = 0; c < kN; ++c) {
      const int j = (c + kN / 2) % kN;
#pragma unroll
      for (int r = 0; r < kM; ++r) {
        const int i = c % 2 ? kM - 1 - r : r;
        acc[i][j] = fmaf(f.a[i], f.b[j], acc[i][j]);
      }
    }
  }

  // One k-step, loads then FMAs.
  __device__ __forceinline__ void fma(const float* as, const float* bs) {
    Fragment f;
    load(f, as, bs);
    fma(f);
  }

  // Where acc[i][4 * j4 .. 4 * j4 + 3] sits in the warp tile.
  __device__ __forceinline__ int row_of(int i) const { return 32 * (i / 4) + row + i % 4; }
  __device__ __forceinline__ int col_of(int j4) const { return 16 * j4 + col; }

  // out[m][n .. n + 3] = v, masked at the edges: one 16-byte store where out's rows allow it
  // (vec: N % 4 == 0 and out 16-byte aligned) and the piece is inside.
  __device__ __forceinline__ static void store4(const MatmulProblem& p, int m, int n, float4 v, bool vec) {
    if (m >= p.M) return;
    float* out = p.out + int64_t(m) * p.N + n;  // int64: m * N passes 2^31 for big outputs
    if (vec && n + 3 < p.N) {
      *reinterpret_cast<float4*>(out) = v;
    } else {
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
        if (n + jj < p.N) out[jj] = f[jj];
    }
  }

  // Masked stores of the tile whose warp tile starts at (m0, n0) of out.
  __device__ __forceinline__ void store(const MatmulProblem& p, int m0, int n0, bool vec) const {
#pragma unroll
    for (int i = 0; i < kM; ++i)
#pragma unroll
      for (int j = 0; j < kN / 4; ++j) {
        const float* a = &acc[i][4 * j];
        store4(p, m0 + row_of(i), n0 + col_of(j), make_float4(a[0], a[1], a[2], a[3]), vec);
      }
  }
};

}  // namespace rosetta
