/*
Step 2 — bias + GELU on the fp32 accumulators, before the only store
Changed:  step 1's GEMM runs with an epilogue policy instead of the identity: each consumer
          warpgroup adds bias and applies GELU to its fp32 accumulators in registers (the
          tile's bias staged once in the warpgroup's staging box), then converts and stores
          through the same swizzled staging boxes and TMA stores. The second pass and out's
          round trip are gone, and z is rounded once. Backward: the recompute GEMM's
          epilogue loads the dy values at its own accumulator positions (plain loads, 4-byte
          pairs where dy is row-major), turns z into dz = dy * gelu'(z + bias), stores dz and
          writes its 64 rows' fp32 column sums (warp shuffles over a warp's 16 rows, then the 4
          warps added in order in the staging boxes) as one partial row of dbias; then
          reduce_partials and the two GEMMs of step 1. K = 0 takes step 1's pass on zeros.
Why:      step 1's pass moved 2 x 2MN bytes. Here the epilogue adds ALU work only: per 128 x 256
          tile 32K GELUs at one MUFU op each in bf16 (the hardware tanh; fp16 needs the more
          accurate ex2 + reciprocal, two, ~4K cycles: 7% of 4096^3 measured), ~2K cycles
          (~1.2 us), against the tile's MMAs at 2 x 128 x 256 x K flop / ~7.5 TFLOP/s an SM:
          ~36 us at K = 4096, ~7 us at K = 768. Predicted: bf16 ~1.03x the bare GEMM at 4096^3,
          fp16 ~1.07x.
Still:    the consumer warpgroups do their epilogues together, so the tensor cores idle during
          the GELU math and the stores (the epilogue's share is largest where K is short). Step 3
          overlaps one consumer's epilogue with the other's MMAs (ping-pong) and is slower: its
          half-size tile costs the mainloop more than the epilogue did. The backward is
          slower than step 1's (H100 4096^3: 645 us against 588): each thread loads its dy
          values one column block at a time behind the mask branches, so a load's latency is
          paid 24-32 times a tile, whatever K (batching them spilled at 168 / 128 registers);
          dy wants TMA boxes into shared memory, loaded by the producer with the tile.
Limits:   M, N, K < 2^31. K = 0 (z = bias: no GEMM to fuse into) is refused before launch
          (`Min: k`); step 1 takes it. Workspace (backward): M x N rounded up to 8 of T (dz)
          and ceil(M / 64) x N fp32.
Dtypes:   bfloat16, float16
Layout:   tma
Min:      k >= 1
*/
#include "gelu.cuh"

namespace {

namespace gemm = rosetta::sm90::gemm;
namespace gl = rosetta::gelu;
namespace nm = rosetta::norm;
using rosetta::from_float;
using rosetta::to_float;

// Column n of bias as float, 0 past N (those accumulator columns are never stored).
template <typename T>
__device__ __forceinline__ float bias_at(const T* bias, int n, int N) {
  return n < N ? to_float(bias[n]) : 0.0f;
}

// out = gelu(acc + bias). The tile's kBN bias values are staged in the warpgroup's staging boxes
// first (each thread loads 2 of them from global memory): the GELU loop then reads them back
// with short-latency shared loads (a warp reads 4 addresses, broadcast to 8 rows each). With
// global loads in the loop ptxas hoisted them far ahead and spilled at 168 (128 x 256) and
// 128 (192 x 192) registers a thread, 128 or 96 of them accumulators.
template <typename T>
struct BiasGelu {
  const T* __restrict__ bias;

  template <int kN>
  __device__ __forceinline__ void operator()(float (&d)[kN], const gemm::TileInfo& t) const {
    constexpr int kCols = 2 * kN;  // the tile's columns
    static_assert(kCols * 4 <= gemm::TileInfo::kScratchBytes, "the tile's bias fits the staging");
    float* const b = reinterpret_cast<float*>(t.claim_scratch());
    for (int j = threadIdx.x % 128; j < kCols; j += 128) b[j] = bias_at(bias, t.n0 + j, t.N);
    rosetta::sm90::named_barrier(t.barrier, 128);
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int c = 0; c < kN / 4; ++c) {
      const float2 bc = *reinterpret_cast<const float2*>(b + 8 * c + 2 * (lane % 4));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        d[4 * c + 2 * h] = gl::gelu<T>(d[4 * c + 2 * h] + bc.x);
        d[4 * c + 2 * h + 1] = gl::gelu<T>(d[4 * c + 2 * h + 1] + bc.y);
      }
    }
  }
};

// acc (= z - bias) -> dz = dy * gelu'(z), and partial[m0 / 64][n] = the sum of dz over the
// warpgroup's 64 rows. Rows past M and columns past N get dy = 0, so dz = 0 there and the sums
// need no mask.
template <typename T>
struct GeluBackward {
  const T* __restrict__ bias;
  const T* __restrict__ dy;
  int64_t dy_s0, dy_s1;
  bool dy_pairs;  // dy row-major, even row stride, 4-byte aligned: (n, n + 1) is one 4-byte load
  float* __restrict__ partial;  // ceil(M / 64) rows of N

  template <int kN>
  __device__ __forceinline__ void operator()(float (&d)[kN], const gemm::TileInfo& t) const {
    constexpr int kCols = 2 * kN;  // the tile's columns
    static_assert(4 * kCols * 4 <= gemm::TileInfo::kScratchBytes, "4 warps' column sums fit the staging");
    float* const sums = reinterpret_cast<float*>(t.claim_scratch());  // [warp][column]
    const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int c = 0; c < kN / 4; ++c) {
      const int n = t.n0 + 8 * c + 2 * (lane % 4);
      const float b0 = bias_at(bias, n, t.N), b1 = bias_at(bias, n + 1, t.N);
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = t.m0 + 16 * warp + lane / 4 + 8 * h;
        float g0 = 0.0f, g1 = 0.0f;
        if (m < t.M) {
          const T* p = dy + int64_t(m) * dy_s0 + int64_t(n) * dy_s1;  // int64: m * stride passes 2^31
          if (dy_pairs && n + 1 < t.N) {
            const uint32_t bits = __ldg(reinterpret_cast<const unsigned int*>(p));
            const T* v = reinterpret_cast<const T*>(&bits);
            g0 = to_float(v[0]), g1 = to_float(v[1]);
          } else {
            if (n < t.N) g0 = to_float(p[0]);
            if (n + 1 < t.N) g1 = to_float(p[dy_s1]);
          }
        }
        float& z0 = d[4 * c + 2 * h];
        float& z1 = d[4 * c + 2 * h + 1];
        z0 = g0 * gl::gelu_grad(z0 + b0);
        z1 = g1 * gl::gelu_grad(z1 + b1);
        s0 += z0, s1 += z1;
      }
      // The warp's 16 rows: lanes l, l ^ 4, l ^ 8, l ^ 16 hold the same columns. The same
      // butterfly in every lane: a fixed order, so dbias is deterministic.
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, off);
        s1 += __shfl_xor_sync(0xffffffffu, s1, off);
      }
      if (lane < 4) {
        sums[warp * kCols + 8 * c + 2 * lane] = s0;
        sums[warp * kCols + 8 * c + 2 * lane + 1] = s1;
      }
    }
    rosetta::sm90::named_barrier(t.barrier, 128);
    if (t.m0 >= t.M) return;  // the lower tile of a pair past M: no partial row of its own
    float* const row = partial + int64_t(t.m0 / 64) * t.N;
    for (int j = threadIdx.x % 128; j < kCols; j += 128) {
      if (t.n0 + j >= t.N) break;
      row[t.n0 + j] = ((sums[j] + sums[kCols + j]) + sums[2 * kCols + j]) + sums[3 * kCols + j];
    }
  }
};

// The fused epilogues fit the 3-consumer 192 x 192 tile too: ptxas allocates it 128 registers
// a thread (65,536 / 512 threads), 96 of them accumulators, without spilling.
constexpr bool kThreeConsumers = true;

}  // namespace

cudaError_t linear_gelu_02_fused_epilogue(const rosetta::LinearGeluArgs& args, cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.weight.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || K == 0) return cudaErrorInvalidValue;  // K: Min: k
  if (M == 0 || N == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* const out = args.out.ptr<T>();
    const T* const bias = args.bias.ptr<const T>();
    status = gemm::run<T, kThreeConsumers>(args.a, args.weight, out, N, int(M), int(N), int(K), BiasGelu<T>{bias},
                                           stream);
  });
  return status != cudaSuccess ? status : launched;
}

cudaError_t linear_gelu_02_fused_epilogue_backward(const rosetta::LinearGeluBackwardArgs& args,
                                                   cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.weight.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || K == 0) return cudaErrorInvalidValue;  // K: Min: k
  if (M == 0) {  // no rows: dweight and dbias are sums of nothing (da is empty)
    const cudaError_t e = nm::zero(args.dweight, stream);
    return e != cudaSuccess ? e : nm::zero(args.dbias, stream);
  }
  if (N == 0) return nm::zero(args.da, stream);  // da = dz @ weight^T over no columns; the rest is empty
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* const bias = args.bias.ptr<const T>();
    const int64_t ldz = gl::padded_cols(N);  // dz is a TMA operand below: 16-byte rows
    T* const dz = args.workspace.get<T>(M * ldz);
    int64_t parts = 0;
    float* partial = nullptr;
    {
      parts = rosetta::ceil_div(M, 64);  // one partial row per consumer warpgroup's 64 rows
      partial = args.workspace.get<float>(parts * N);
      const rosetta::Tensor& dy = args.dy;
      const bool pairs = dy.stride[1] == 1 && dy.stride[0] % 2 == 0 && reinterpret_cast<uintptr_t>(dy.data) % 4 == 0;
      const GeluBackward<T> epilogue{bias, dy.ptr<const T>(), dy.stride[0], dy.stride[1], pairs, partial};
      status = gemm::run<T, kThreeConsumers>(args.a, args.weight, dz, ldz, int(M), int(N), int(K), epilogue, stream);
    }
    if (status != cudaSuccess) return;
    nm::reduce_partials<T, 1><<<nm::column_grid(N), nm::column_block(), 0, stream>>>(
        partial, parts, N, args.dbias.ptr<T>(), static_cast<T*>(nullptr));
    const rosetta::Tensor dz_view = gl::matrix(dz, args.a.dtype, M, N, ldz, 1);
    status = gemm::run<T>(dz_view, gl::transposed(args.weight), args.da.ptr<T>(), K, int(M), int(K), int(N),
                          gemm::Identity{}, stream);
    if (status != cudaSuccess) return;
    status = gemm::run<T>(gl::transposed(args.a), dz_view, args.dweight.ptr<T>(), N, int(K), int(N), int(M),
                          gemm::Identity{}, stream);
  });
  return status != cudaSuccess ? status : launched;
}
