/*
Step 4 — the tile asked of L2 before the generator runs
Changed:  step 3's blocks, vectors, mask and fallback, plus one instruction: as a block starts, its
          thread 0 asks the copy engine to bring the block's whole input tile (16 KB at every
          dtype) into L2 with one cp.async.bulk.prefetch.L2 -- no destination register, no
          barrier, nothing to wait for. The threads' own 16-byte loads then find their lines in
          L2 or already on the way. The loads go through __ldg: with x handed to an asm
          statement nvcc no longer proves it read-only and would drop the .nc path.
Why:      step 3 issues its four loads in PTX before any Philox call, but ptxas sinks them: in
          its bf16 SASS the first LDG.E.128 comes after ~550 of the vector path's ~850
          instructions, the generator's, whatever the register budget (launch bounds of 2, 4 or 8
          blocks: same order). A warp's bytes are in flight only at the end of its life, and
          at 16 bits the generator is ~60% of the memory time, so the SM holds fewer bytes in
          flight than Little's law asks for (~18 KB at 3.35 TB/s x ~700 ns) for part of each
          block. Triton's step 3 keeps the loads first (its first LDG.E.128 is the ~200th of 848
          instructions at BLOCK 4096) and reads ~3,020 GB/s where this ladder read 2,880. A
          prefetch has no result, so there is nothing for the scheduler to sink: the DRAM read
          starts at the block's first instruction, under the whole generator.
Still:    the tile is read twice from the memory system's point of view (DRAM -> L2 by the
          prefetch, L2 -> SM by the loads); L2 has the room (8 blocks x 16 KB x 132 SMs = 17 MB
          of 50 MB), and the L2 -> SM path is not this kernel's limit. The last tile and
          misaligned tensors take step 3's scalar path, unprefetched.
Limits:   none (64-bit indices and counters; misaligned pointers take the scalar path).
Layout:   contiguous
Roofline: ~15 integer ops per element vs 8 B (fp32) / 4 B (16-bit): memory-bound, <= 3.35 TB/s
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

// `bytes` (a multiple of 16, from a 16-byte-aligned address) of global memory brought into L2 by
// the copy engine; the issuing thread goes on at once.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes));
}

// A select, not x * keep * scale: at p = 1 scale is inf, and 0 * inf would be NaN.
__device__ __forceinline__ float drop(float x, uint32_t word, const DropParams& d) {
  return rosetta::uniform_float(word) > d.p ? x * d.scale : 0.0f;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
dropout_prefetched(const T* __restrict__ x, T* __restrict__ y, int64_t n, DropParams d, bool aligned) {
  using Vec = rosetta::Vec16<T>;
  constexpr int kVec = Vec::kCount;  // 4 or 8 elements: 1 or 2 Philox groups
  static_assert(kVec % 4 == 0, "a vector holds whole Philox groups");
  constexpr int64_t kTile = int64_t(kThreads) * kUnroll * kVec;  // elements per block
  const int64_t tile_start = int64_t(blockIdx.x) * kTile;

  const bool full = aligned && tile_start + kTile <= n;
  // Ahead of the branch: in the branch ptxas scheduled the prefetch after the generator too.
  if (full && threadIdx.x == 0) prefetch_l2(x + tile_start, uint32_t(kTile * sizeof(T)));
  if (full) {
    const uint4* xv = reinterpret_cast<const uint4*>(x + tile_start);
    uint4* yv = reinterpret_cast<uint4*>(y + tile_start);
    Vec v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u].raw = __ldg(xv + u * kThreads + threadIdx.x);  // loads first
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
    dropout_prefetched<T><<<rosetta::ceil_div(in.numel, kTile), kThreads, 0, stream>>>(
        in.ptr<const T>(), out.ptr<T>(), in.numel, d, aligned);
  });
}

}  // namespace

cudaError_t dropout_04_prefetched_tiles(const rosetta::DropoutArgs& a, cudaStream_t stream) {
  return run(a.x, a.y, a.p, a.seed, a.offset, stream);
}

// The backward regenerates the forward's mask from the same (seed, offset).
cudaError_t dropout_04_prefetched_tiles_backward(const rosetta::DropoutBackwardArgs& a,
                                                 cudaStream_t stream) {
  return run(a.dy, a.dx, a.p, a.seed, a.offset, stream);
}
