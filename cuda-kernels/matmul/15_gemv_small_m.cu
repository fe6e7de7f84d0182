/*
Step 15 — small M: the product as a stream of B's rows on the CUDA cores (GEMV-style)
Changed:  for M <= 8 there are no tiles. A block of 256 threads owns a strip of 32 x V columns
          of B (V = 16 bytes of elements: 8 bf16/fp16, 4 fp32) and a slice of K. Warp w walks the
          slice's rows w, w + 8, w + 16, ..., eight rows a round: the eight 16-byte streaming
          loads (ld.global.cs: read once, evict first) are all issued before the first multiply,
          4 KB of B in flight per warp. Each lane adds a[m][k] x b[k][n..n+V) into M x V fp32
          sums. A's slice waits in shared memory, 256 k at a time, k-major, so a column of A is
          M consecutive floats: 128-bit broadcast loads (every lane the same address). The 8
          warps' sums meet in shared memory.
          With K split over S blocks, each strip's S partial sums go to a workspace and the last
          block of the strip to finish (an atomic ticket per strip) adds them in the order
          z = 0 .. S-1 and writes out: one kernel, and the same bits on every run -- the in-kernel
          fix-up step 14's "Still:" asked for. Slices are whole rounds of 64 rows and the grid
          one wave: a slice's last rows come in one predicated round, not row by row, each row
          a full DRAM latency (at 4 x 4096 x 4096 bf16 that took the step from 28.6 to 22.4 us).
Why:      at M <= 8 a GEMM is a read of B: 1 x 4096 x 4096 bf16 is 33.5 MB for 33.5 Mflop (one
          flop per byte; fp32 half that), ~11 us at 3 TB/s, and nothing else matters. Steps 11-14
          pad M to 64 rows of wgmma (94-98% zeros at M = 1-4: free while memory-bound) and keep
          a tile's pipeline of 24 KB stages per SM, with its fill and drain in every block. Here
          the bytes in flight come from eight rows of loads per warp: S is chosen for ~2 blocks
          per SM (16 warps, 64 KB of B in flight; 256 blocks at 1 x 4096 x 4096 bf16, 16
          K-slices of 256 rows). The fp32 ladder (steps 1-8) has no small-M path at all: step
          8 at 1 x 4096 x 4096 reads B through 128 x 128 tiles on 32 SMs.
Still:    a warp multiplies its eight rows while none of its loads are in flight, and two blocks
          an SM are a quarter of its warps. At one row the step is near what a read of B costs
          here: 33.5 MB in ~20 us, as the reductions of this project read 24.7 MB in 16 (a fixed
          ~8 us of launch and DRAM ramp after the L2 flush, then ~2.9 TB/s), where cuBLAS's GEMV
          takes 16.7; its lead is in that ramp. The partials cost 2 x S x M x N x 4 bytes, mostly
          L2 hits (S is capped so this stays under 1/2 of B's bytes: fewer slices as M grows; at
          1/8, 8 x 768 x 3072 got 3 slices and 36 blocks). A column-major B (a weight stored
          (out, in) and used as W.t()) would need its columns walked instead: the
          dot-product form of a GEMV, not written here, so it is refused (`b_column_major`) and
          steps 11-14 read it through TMA. Each row of B costs a lane V x M FFMAs and the
          conversions: at M = 16 that is ~70 instructions per 8 bytes, the issue rate at HBM
          speed, so M > 8 is left to the tensor cores (step 14). M = 5-7 multiply 8 rows.
Limits:   M <= 8 (`m_rows`), B row-major (`b_column_major`): anything else is refused before
          launch. A needs its last stride 1 (the dispatcher copies it otherwise: M x K is small).
          B's rows use the 16-byte path when B starts on 16 bytes and its row stride is a multiple
          of V, else element by element; N, K < 2^31.
Dtypes:   float32, bfloat16, float16
Layout:   rows
Max:      m_rows <= 8; b_column_major <= 0
*/
#include <climits>

#include "rosetta.cuh"

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunk = 256;      // k rows of A staged in shared memory at a time
constexpr int kMaxSplit = 64;
constexpr int kBlocksPerSm = 2;  // the grid's target: 16 warps an SM, 64 KB of B in flight, long slices

// Elements of B a thread loads per row: 16 bytes.
template <typename T> constexpr int cols_per_thread() { return 16 / int(sizeof(T)); }

// Rows of B a warp loads before it multiplies: all in flight at once, U x 512 bytes a warp.
constexpr int U = 8;
constexpr int kRound = U * kWarps;  // rows of B a block's warps take in one round
static_assert(kChunk % kRound == 0, "a staged chunk of A holds whole rounds");

// V elements of a row as one 16-byte streaming load (B is read exactly once: evict first).
__device__ __forceinline__ uint4 load_raw(const void* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }

template <typename T, int V>
__device__ __forceinline__ void to_floats(const uint4& raw, float (&v)[V]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = rosetta::to_float(e[j]);
}

// acc[m][j] += a[m][k] * b[k][n + j] for the MR rows of A's column k (MR consecutive floats in
// shared memory, the same address for every lane: 128-bit broadcast loads) and V values of B's row k.
template <int MR, int V>
__device__ __forceinline__ void multiply_row(const float* a_k, const float (&bv)[V], float (&acc)[MR][V]) {
  float av[MR];
#pragma unroll
  for (int m = 0; m < MR; ++m) av[m] = a_k[m];
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[m][j] = fmaf(av[m], bv[j], acc[m][j]);
}

// out = a @ b for M <= MR rows of a. Block (x, z): columns [x * 32V, (x + 1) * 32V), k-slice z.
template <typename T, int MR, bool kVec>
__global__ void __launch_bounds__(kThreads, 2)  // <= 128 registers: two blocks an SM at M = 8
    gemv_rows(const T* __restrict__ a, int64_t lda, const T* __restrict__ b, int64_t ldb, T* __restrict__ out,
              float* __restrict__ partials, unsigned* __restrict__ tickets, int M, int N, int K, int slice) {
  constexpr int V = cols_per_thread<T>(), kStrip = 32 * V;
  __shared__ __align__(16) float a_s[kChunk][MR];  // k-major: a column of A is MR consecutive floats
  __shared__ float sums[kWarps][kStrip];
  __shared__ bool last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int strip = blockIdx.x * kStrip;
  const int valid = N - (strip + lane * V);  // this thread's columns that exist (<= 0: none)
  const bool full = kVec && valid >= V;      // the 16-byte path, fixed for the whole block
  const int k_begin = blockIdx.y * slice, k_end = min(K, k_begin + slice);

  float acc[MR][V];
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[m][j] = 0.f;

  for (int c0 = k_begin; c0 < k_end; c0 += kChunk) {
    const int rows = min(kChunk, k_end - c0);
    __syncthreads();  // every warp is done with the previous chunk of A
    for (int i = threadIdx.x; i < MR * kChunk; i += kThreads) {
      const int k = i / MR, m = i % MR;
      a_s[k][m] = m < M && k < rows ? rosetta::to_float(a[m * lda + c0 + k]) : 0.f;
    }
    __syncthreads();
    const T* row = b + int64_t(c0) * ldb + strip + lane * V;
    int k = warp;
    if (full) {
      // U rows a round, every load issued before the first multiply: a warp keeps U x 512 bytes
      // of B in flight instead of waiting out each row's DRAM latency alone. The chunk's last
      // round is predicated, not a row-by-row loop: a row past the chunk loads nothing and
      // multiplies nothing, and the rows that exist are still all in flight at once.
      for (; k < rows; k += U * kWarps) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
          raw[u] = k + u * kWarps < rows ? load_raw(row + int64_t(k + u * kWarps) * ldb) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (k + u * kWarps >= rows) break;  // the same for the whole warp: no divergence
          float bv[V];
          to_floats<T, V>(raw[u], bv);
          multiply_row<MR, V>(a_s[k + u * kWarps], bv, acc);
        }
      }
    } else {  // the ragged last strip, or rows not on 16 bytes: element by element
      for (; k < rows; k += kWarps) {
        float bv[V];
#pragma unroll
        for (int j = 0; j < V; ++j) bv[j] = j < valid ? rosetta::to_float(row[int64_t(k) * ldb + j]) : 0.f;
        multiply_row<MR, V>(a_s[k], bv, acc);
      }
    }
  }

  // Row by row, the 8 warps' sums meet in shared memory; thread t then owns column t of the strip
  // and adds the warps in order (a fixed order: the same bits every run).
  const int n = strip + threadIdx.x;
  const bool owner = threadIdx.x < kStrip && n < N;
#pragma unroll
  for (int m = 0; m < MR; ++m) {
    if (m >= M) break;  // M is the same for the whole block: the barriers below stay uniform
    __syncthreads();
#pragma unroll
    for (int j = 0; j < V; ++j) sums[warp][lane * V + j] = acc[m][j];
    __syncthreads();
    if (owner) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += sums[w][threadIdx.x];
      if (gridDim.y == 1) out[int64_t(m) * N + n] = rosetta::from_float<T>(s);
      else partials[(int64_t(blockIdx.y) * M + m) * N + n] = s;
    }
  }
  if (gridDim.y == 1) return;

  // The split's fix-up: the strip's last block to finish adds the S partial sums, z = 0 .. S-1.
  __threadfence();  // this block's partials are visible device-wide before its ticket is
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&tickets[blockIdx.x], 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // and the other blocks' partials are visible to this one
  const int split = int(gridDim.y);
  for (int i = threadIdx.x; i < M * kStrip; i += kThreads) {
    const int m = i / kStrip, col = strip + i % kStrip;
    if (col >= N) continue;
    const float* p = partials + int64_t(m) * N + col;
    const int64_t next = int64_t(M) * N;  // from one slice's partial to the next
    float s = 0.f;
    int z = 0;
    // eight slices' loads in flight, then added in order: one L2 round trip per eight slices
    // instead of one per slice, the same sum (the order z = 0 .. S-1 is kept)
    for (; z + 8 <= split; z += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = __ldcg(p + (z + u) * next);  // L2, not a stale L1 line
#pragma unroll
      for (int u = 0; u < 8; ++u) s += v[u];
    }
    for (; z < split; ++z) s += __ldcg(p + z * next);
    out[int64_t(m) * N + col] = rosetta::from_float<T>(s);
  }
}

// K-slices: at most kBlocksPerSm blocks per SM in all (one wave: a second wave of a few blocks
// would double the time of the whole product), slices a whole number of rounds (kRound rows: every
// warp's last round as full as the others), and partials (2 x S x M x N x 4 bytes, written and read
// back through L2) under 1/2 of B's K x N x sizeof(T). Returns the slice's rows.
int choose_slice(int64_t strips, int M, int K, int element_bytes) {
  int64_t split = std::max<int64_t>(int64_t(kBlocksPerSm) * rosetta::sm_count() / strips, 1);
  split = std::min({split, rosetta::ceil_div(int64_t(K), int64_t(kRound)),
                    int64_t(K) * element_bytes / (16 * int64_t(M)), int64_t(kMaxSplit)});
  split = std::max<int64_t>(split, 1);
  return int(rosetta::ceil_div(rosetta::ceil_div(int64_t(K), split), int64_t(kRound)) * kRound);
}

template <typename T, int MR>
cudaError_t launch(const rosetta::MatmulArgs& args, int M, int N, int K, cudaStream_t stream) {
  constexpr int V = cols_per_thread<T>(), kStrip = 32 * V;
  const int64_t strips = rosetta::ceil_div(N, kStrip);
  if (strips > INT_MAX) return cudaErrorInvalidValue;
  const int slice = choose_slice(strips, M, K, sizeof(T));
  const int split = int(rosetta::ceil_div(K, slice));  // no empty slice
  float* partials = nullptr;
  unsigned* tickets = nullptr;
  if (split > 1) {
    partials = args.workspace.get<float>(int64_t(split) * M * N);
    tickets = args.workspace.get<unsigned>(strips);
    cudaMemsetAsync(tickets, 0, strips * sizeof(unsigned), stream);
  }
  const T* b = args.b.ptr<const T>();
  const int64_t ldb = args.b.stride[0];
  const bool vec = reinterpret_cast<uintptr_t>(b) % (V * sizeof(T)) == 0 && ldb % V == 0;
  const dim3 grid{unsigned(strips), unsigned(split)};
  auto kernel = vec ? gemv_rows<T, MR, true> : gemv_rows<T, MR, false>;
  kernel<<<grid, kThreads, 0, stream>>>(args.a.ptr<const T>(), args.a.stride[0], b, ldb, args.out.ptr<T>(), partials,
                                        tickets, M, N, K, slice);
  return cudaGetLastError();
}

}  // namespace

cudaError_t matmul_15_gemv_small_m(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.b.size[1];
  if (M > 8 || N > INT_MAX || K > INT_MAX) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (K == 0) {  // the empty sum: zeros (all-zero bits are +0 in every dtype here)
      cudaMemsetAsync(args.out.data, 0, M * N * int64_t(sizeof(T)), stream);
      return;
    }
    const int m = int(M), n = int(N), k = int(K);
    status = M <= 1 ? launch<T, 1>(args, m, n, k, stream)
           : M <= 2 ? launch<T, 2>(args, m, n, k, stream)
           : M <= 4 ? launch<T, 4>(args, m, n, k, stream)
                    : launch<T, 8>(args, m, n, k, stream);
  });
  return status != cudaSuccess ? status : launched;
}
