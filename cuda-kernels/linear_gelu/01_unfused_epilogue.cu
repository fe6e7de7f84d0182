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
    if (status == cudaSuccess) status = gl::launch_bias_gelu(out, args.bias.ptr<const T>(), M, N, stream);
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
    const gl::RowChunks plan = gl::plan_rows(M, N);
    float* const partial = args.workspace.get<float>(int64_t(plan.grid.y) * N);
    if (K == 0) cudaMemsetAsync(dz, 0, M * ldz * int64_t(sizeof(T)), stream);  // z = bias
    else status = gemm::run<T>(args.a, args.weight, dz, ldz, int(M), int(N), int(K), gemm::Identity{}, stream);
    if (status != cudaSuccess) return;
    status = gl::launch_gelu_backward(plan, dz, ldz, args.dy, args.bias.ptr<const T>(), partial, M, N, stream);
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
