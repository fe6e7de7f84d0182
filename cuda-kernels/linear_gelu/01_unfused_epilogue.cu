/*
Step 1 — matmul step 13's GEMM, then a separate bias + GELU pass
Changed:  the baseline the fusion is measured against. Forward: matmul step 13's persistent
          cluster GEMM (common/gemm_sm90.cuh, identity epilogue) writes a @ weight into out,
          rounded to T; a second kernel reads out back, adds bias and applies the tanh GELU in
          fp32 (gelu = z sigmoid(2u): one ex2, one reciprocal) and writes it in place (16-byte
          vectors, each thread 8 columns, bias in registers over a chunk of rows). Backward: the
          same GEMM recomputes z into a dz buffer (rows padded to 16 bytes: da's and dweight's
          GEMMs read it through TMA), a pass turns it in place into dz = dy * gelu'(z + bias)
          and writes per-chunk fp32 column sums, norm.cuh's reduce_partials adds those in a fixed
          order into dbias, and two more GEMMs give da = dz @ weight^T and dweight = a^T @ dz
          (the transposes are the other major-ness of the same memory: no copy).
Why:      a GEMM library without epilogue fusion does exactly this (torch's mm, + b, gelu).
          The cost is the M x N round trip: 2 x 2MN bytes more than the GEMM's own traffic.
          4096^3 bf16: 67 MB, ~22 us at ~3 TB/s beside a ~185 us GEMM (+12%). GPT-2's
          2048 x 768 x 3072: 25 MB (~8 us, some of it from L2) plus a launch beside a ~15 us
          GEMM: +50% or more, as K is short. The backward pays 3MN x 2 bytes in its pass.
Still:    out is written by the GEMM only to be read back at once; z is rounded to T before
          the bias and GELU (two roundings where one would do). Step 2 applies both to the
          fp32 accumulators before the only store.
Limits:   M, N, K < 2^31. Workspace (backward): M x N rounded up to 8 of T (dz) and
          chunks x N fp32, chunks <= 16 x SMs.
Dtypes:   bfloat16, float16
Layout:   tma
*/
#include "gelu.cuh"

namespace {

namespace gemm = rosetta::sm90::gemm;
namespace gl = rosetta::gelu;
namespace nm = rosetta::norm;
using gl::gelu;
using gl::gelu_grad;
using rosetta::aligned16;
using rosetta::ceil_div;
using rosetta::from_float;
using rosetta::sm_count;
using rosetta::Tensor;
using rosetta::to_float;

// ------------------------------------------------------------------------------------------------
// The elementwise passes of this step: a block of 128 threads takes 1,024 columns (8 a thread, one
// 16-byte vector of 16-bit values), blockIdx.y a contiguous chunk of rows; the thread keeps its
// columns' bias (and dbias sums) in registers over the chunk, kBatch rows' loads in flight at once.

constexpr int kThreads = 128, kCols = 8, kBatch = 4;

struct RowChunks {
  dim3 grid;
  int64_t rows;  // per chunk; chunks = grid.y
};
// About 16 blocks an SM in all (2,048 threads: 4 x 16 bytes in flight each, 128 KB an SM).
inline RowChunks plan_rows(int64_t M, int64_t N) {
  const int64_t xs = ceil_div(N, int64_t(kThreads) * kCols);
  const int64_t want = std::min<int64_t>({M, 65535, std::max<int64_t>(1, 16 * sm_count() / xs)});
  const int64_t rows = ceil_div(M, want);
  return {dim3(unsigned(xs), unsigned(ceil_div(M, rows))), rows};
}

template <typename T>
struct Vec8 {
  T v[kCols];
};

// 8 values of T at p (columns n .. n + 7 of a row, p aligned to 16 bytes when kVec) as floats;
// the columns at or past `valid` read as 0; `stride` apart on the scalar path.
template <typename T, bool kVec>
__device__ __forceinline__ void load8(const T* p, int64_t stride, int64_t valid, float (&x)[kCols]) {
  if (kVec) {
    const Vec8<T> v = *reinterpret_cast<const Vec8<T>*>(p);
#pragma unroll
    for (int e = 0; e < kCols; ++e) x[e] = to_float(v.v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kCols; ++e) x[e] = e < valid ? to_float(p[e * stride]) : 0.0f;
  }
}
template <typename T, bool kVec>
__device__ __forceinline__ void store8(T* p, int64_t valid, const float (&x)[kCols]) {
  if (kVec) {
    Vec8<T> v;
#pragma unroll
    for (int e = 0; e < kCols; ++e) v.v[e] = from_float<T>(x[e]);
    *reinterpret_cast<Vec8<T>*>(p) = v;
  } else {
#pragma unroll
    for (int e = 0; e < kCols; ++e)
      if (e < valid) p[e] = from_float<T>(x[e]);
  }
}

// out (M x N, row stride N) = gelu(out + bias), in place. kVec: N % 8 == 0 and out 16-byte aligned.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) bias_gelu_rows(T* __restrict__ out, const T* __restrict__ bias,
                                                           int64_t M, int64_t N, int64_t chunk) {
  const int64_t n = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  if (n >= N) return;
  const int64_t valid = N - n;
  float b[kCols];
  load8<T, false>(bias + n, 1, valid, b);
  const int64_t m_end = M < (int64_t(blockIdx.y) + 1) * chunk ? M : (int64_t(blockIdx.y) + 1) * chunk;
  for (int64_t m = int64_t(blockIdx.y) * chunk; m < m_end; m += kBatch) {
    float x[kBatch][kCols];
#pragma unroll
    for (int r = 0; r < kBatch; ++r)
      if (m + r < m_end) load8<T, kVec>(out + (m + r) * N + n, 1, valid, x[r]);
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (m + r >= m_end) continue;
#pragma unroll
      for (int e = 0; e < kCols; ++e) x[r][e] = gelu<T>(x[r][e] + b[e]);
      store8<T, kVec>(out + (m + r) * N + n, valid, x[r]);
    }
  }
}

template <typename T>
cudaError_t launch_bias_gelu(T* out, const T* bias, int64_t M, int64_t N, cudaStream_t stream) {
  if (M == 0 || N == 0) return cudaSuccess;
  const RowChunks plan = plan_rows(M, N);
  const bool vec = N % kCols == 0 && aligned16(out);
  (vec ? bias_gelu_rows<T, true> : bias_gelu_rows<T, false>)<<<plan.grid, kThreads, 0, stream>>>(
      out, bias, M, N, plan.rows);
  return cudaGetLastError();
}

// dz (M x N, row stride ldz: a multiple of 8, 16-byte aligned base) holds z without the bias; in
// place dz = dy * gelu'(z + bias), 0 in the padding columns, and partial[chunk][n] = the chunk's
// fp32 sum of dz over its rows (blockIdx.y = chunk). dy: strides dy_s0, dy_s1 (row- or
// column-major); kVec: dy row-major with 16-byte aligned rows and N % 8 == 0.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    gelu_backward_rows(T* __restrict__ dz, int64_t ldz, const T* __restrict__ dy, int64_t dy_s0, int64_t dy_s1,
                       const T* __restrict__ bias, float* __restrict__ partial, int64_t M, int64_t N,
                       int64_t chunk) {
  const int64_t n = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  if (n >= N) return;
  const int64_t valid = N - n;
  float b[kCols], sum[kCols] = {};
  load8<T, false>(bias + n, 1, valid, b);
  const int64_t m_end = M < (int64_t(blockIdx.y) + 1) * chunk ? M : (int64_t(blockIdx.y) + 1) * chunk;
  for (int64_t m = int64_t(blockIdx.y) * chunk; m < m_end; m += kBatch) {
    float z[kBatch][kCols], g[kBatch][kCols];
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (m + r >= m_end) continue;
      load8<T, true>(dz + (m + r) * ldz + n, 1, valid, z[r]);  // within the padded row: whole vectors
      load8<T, kVec>(dy + (m + r) * dy_s0 + n * dy_s1, dy_s1, valid, g[r]);
    }
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (m + r >= m_end) continue;
#pragma unroll
      for (int e = 0; e < kCols; ++e) {
        // padding columns hold whatever the allocation held (NaN, say): zero them, not 0 * NaN
        z[r][e] = e < valid ? g[r][e] * gelu_grad(z[r][e] + b[e]) : 0.0f;
        sum[e] += z[r][e];
      }
      store8<T, true>(dz + (m + r) * ldz + n, kCols, z[r]);
    }
  }
  float* p = partial + int64_t(blockIdx.y) * N + n;
#pragma unroll
  for (int e = 0; e < kCols; ++e)
    if (e < valid) p[e] = sum[e];
}

// `plan` = plan_rows(M, N): partial holds plan.grid.y rows of N.
template <typename T>
cudaError_t launch_gelu_backward(const RowChunks& plan, T* dz, int64_t ldz, const Tensor& dy, const T* bias,
                                 float* partial, int64_t M, int64_t N, cudaStream_t stream) {
  const bool vec = N % kCols == 0 && dy.stride[1] == 1 && dy.stride[0] % kCols == 0 && aligned16(dy.data);
  (vec ? gelu_backward_rows<T, true> : gelu_backward_rows<T, false>)<<<plan.grid, kThreads, 0, stream>>>(
      dz, ldz, dy.ptr<const T>(), dy.stride[0], dy.stride[1], bias, partial, M, N, plan.rows);
  return cudaGetLastError();
}

}  // namespace

cudaError_t linear_gelu_01_unfused_epilogue(const rosetta::LinearGeluArgs& args, cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.weight.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* const out = args.out.ptr<T>();
    if (K == 0) cudaMemsetAsync(out, 0, M * N * int64_t(sizeof(T)), stream);  // z = the empty sum, then + bias
    else status = gemm::run<T>(args.a, args.weight, out, N, int(M), int(N), int(K), gemm::Identity{}, stream);
    if (status == cudaSuccess) status = launch_bias_gelu(out, args.bias.ptr<const T>(), M, N, stream);
  });
  return status != cudaSuccess ? status : launched;
}

cudaError_t linear_gelu_01_unfused_epilogue_backward(const rosetta::LinearGeluBackwardArgs& args,
                                                     cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.weight.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return cudaErrorInvalidValue;
  if (M == 0) {  // no rows: dweight and dbias are sums of nothing (da is empty)
    const cudaError_t e = nm::zero(args.dweight, stream);
    return e != cudaSuccess ? e : nm::zero(args.dbias, stream);
  }
  if (N == 0) return nm::zero(args.da, stream);  // da = dz @ weight^T over no columns; the rest is empty
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t ldz = gl::padded_cols(N);
    T* const dz = args.workspace.get<T>(M * ldz);
    const RowChunks plan = plan_rows(M, N);
    float* const partial = args.workspace.get<float>(int64_t(plan.grid.y) * N);
    if (K == 0) cudaMemsetAsync(dz, 0, M * ldz * int64_t(sizeof(T)), stream);  // z = bias
    else status = gemm::run<T>(args.a, args.weight, dz, ldz, int(M), int(N), int(K), gemm::Identity{}, stream);
    if (status != cudaSuccess) return;
    status = launch_gelu_backward(plan, dz, ldz, args.dy, args.bias.ptr<const T>(), partial, M, N, stream);
    if (status != cudaSuccess) return;
    nm::reduce_partials<T, 1><<<nm::column_grid(N), nm::column_block(), 0, stream>>>(
        partial, plan.grid.y, N, args.dbias.ptr<T>(), static_cast<T*>(nullptr));
    if (K == 0) return;  // da (M x 0) and dweight (0 x N) are empty
    const rosetta::Tensor dz_view = gl::matrix(dz, args.a.dtype, M, N, ldz, 1);
    status = gemm::run<T>(dz_view, gl::transposed(args.weight), args.da.ptr<T>(), K, int(M), int(K), int(N),
                          gemm::Identity{}, stream);
    if (status != cudaSuccess) return;
    status = gemm::run<T>(gl::transposed(args.a), dz_view, args.dweight.ptr<T>(), N, int(K), int(N), int(M),
                          gemm::Identity{}, stream);
  });
  return status != cudaSuccess ? status : launched;
}
