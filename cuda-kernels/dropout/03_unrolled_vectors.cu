/*
Step 3 — four 16-byte vectors per thread, Philox under the loads
Changed:  one-shot blocks of 256 threads x 4 vectors of 16 bytes (Vec16: 4 fp32 = one Philox
          group, 8 fp16/bf16 = two groups); each thread issues its four loads, then runs its 4
          (fp32) or 8 (16-bit) Philox calls, masks and stores. The mask is step 1's, bit for
          bit. Full tiles of aligned tensors take the vector path; the last tile (and every tile
          when x or y is not 16-byte aligned) goes group by group with scalar accesses.
Why:      step 2 has one vector (8 bytes at 16 bits) in flight per thread and computes its Philox
          after the load is issued but before the next load can be: 2048 threads x 16 B = 32 KB
          per SM at best. Here 64 bytes per thread are requested before any Philox runs, and the
          ~15 integer instructions per element do not depend on x, so they overlap the loads
          (ptxas in fact hoists most calls above the loads; the overlap then comes from the other
          warps: 40 registers, 6 blocks = 48 warps per SM): up to ~96 KB requested per SM, far
          past the ~18 KB that Little's law asks for at 3.35 TB/s x ~700 ns. The generator's ~0.16 SM-clocks per element stays under
          the memory time (~0.55 clocks per fp32 element, ~0.28 per 16-bit one, at 3.35 TB/s).
          This is vector_add step 4's shape, with the Philox hidden inside it.
Still:    at 16 bits the generator is ~60% of the memory time, so the SM's issue slots are busy;
          a shorter Philox (7 rounds) would not be Triton's mask.
Limits:   none (64-bit indices and counters; misaligned pointers take the scalar path).
Layout:   contiguous
Roofline: ~15 integer ops per element vs 8 B (fp32) / 4 B (16-bit): memory-bound, <= 3.35 TB/s
Mirrors:  Triton step 03 (BLOCK and num_warps autotuned: more bytes in flight per SM)
*/
#include <cmath>

#include "philox.cuh"
#include "primitives.cuh"
#include "rosetta.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte vectors per thread

struct DropParams {
  uint64_t seed;    // Philox key: k0 = low 32 bits, k1 = high 32 bits
  uint64_t offset;  // counter of element 0's group; element i uses offset + i / 4
  float p;          // fp32(p): u is compared with it in fp32, as in Triton
  float scale;      // fp32(1 / (1 - p)), divided in double
};

DropParams drop_params(double p, int64_t seed, int64_t offset) {
  return {uint64_t(seed), uint64_t(offset), float(p), float(p < 1.0 ? 1.0 / (1.0 - p) : INFINITY)};
}

// A select, not x * keep * scale: at p = 1 scale is inf, and 0 * inf would be NaN.
__device__ __forceinline__ float drop(float x, uint32_t word, const DropParams& d) {
  return rosetta::uniform_float(word) > d.p ? x * d.scale : 0.0f;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
dropout_unrolled(const T* __restrict__ x, T* __restrict__ y, int64_t n, DropParams d, bool aligned) {
  using Vec = rosetta::Vec16<T>;
  constexpr int kVec = Vec::kCount;  // 4 or 8 elements: 1 or 2 Philox groups
  static_assert(kVec % 4 == 0, "a vector holds whole Philox groups");
  constexpr int64_t kTile = int64_t(kThreads) * kUnroll * kVec;  // elements per block
  const int64_t tile_start = int64_t(blockIdx.x) * kTile;

  if (aligned && tile_start + kTile <= n) {
    const uint4* xv = reinterpret_cast<const uint4*>(x + tile_start);
    uint4* yv = reinterpret_cast<uint4*>(y + tile_start);
    Vec v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u].raw = xv[u * kThreads + threadIdx.x];  // loads first
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // First element of this vector, then its groups: tile_start and kVec are multiples of 4.
      const int64_t first = tile_start + int64_t(u * kThreads + threadIdx.x) * kVec;
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) {
        const uint4 r = rosetta::philox4x32_10(d.offset + uint64_t(first / 4 + q), d.seed);
#pragma unroll
        for (int k = 0; k < 4; ++k)
          v[u].set(4 * q + k, drop(v[u].get(4 * q + k), rosetta::philox_word(r, k), d));
      }
      yv[u * kThreads + threadIdx.x] = v[u].raw;
    }
    return;
  }
  // The last tile, or misaligned data: one group per thread per pass, still one call per group.
  const int64_t tile_end = std::min(n, tile_start + kTile);
  for (int64_t first = tile_start + 4 * int64_t(threadIdx.x); first < tile_end; first += 4 * kThreads) {
    const uint4 r = rosetta::philox4x32_10(d.offset + uint64_t(first / 4), d.seed);
    for (int k = 0; k < 4 && first + k < tile_end; ++k)
      y[first + k] = rosetta::from_float<T>(drop(rosetta::to_float(x[first + k]), rosetta::philox_word(r, k), d));
  }
}

cudaError_t run(const rosetta::Tensor& in, const rosetta::Tensor& out, double p, int64_t seed,
                int64_t offset, cudaStream_t stream) {
  if (in.numel == 0) return cudaSuccess;
  const bool aligned = rosetta::aligned16(in.data) && rosetta::aligned16(out.data);
  const DropParams d = drop_params(p, seed, offset);
  return rosetta::dispatch_dtype(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t kTile = int64_t(kThreads) * kUnroll * (16 / sizeof(T));
    dropout_unrolled<T><<<rosetta::ceil_div(in.numel, kTile), kThreads, 0, stream>>>(
        in.ptr<const T>(), out.ptr<T>(), in.numel, d, aligned);
  });
}

}  // namespace

cudaError_t dropout_03_unrolled_vectors(const rosetta::DropoutArgs& a, cudaStream_t stream) {
  return run(a.x, a.y, a.p, a.seed, a.offset, stream);
}

// The backward regenerates the forward's mask from the same (seed, offset).
cudaError_t dropout_03_unrolled_vectors_backward(const rosetta::DropoutBackwardArgs& a,
                                                 cudaStream_t stream) {
  return run(a.dy, a.dx, a.p, a.seed, a.offset, stream);
}
