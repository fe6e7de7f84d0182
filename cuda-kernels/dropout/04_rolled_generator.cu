/*
Step 4 — the loads first, the generator in a loop the scheduler cannot reorder
Changed:  step 3's blocks, vectors, mask and fallback; the four 16-byte loads are issued, then a
          loop kept rolled (#pragma unroll 1) runs the generator two vectors a pass: their Philox
          calls, masks and stores, the two later vectors moving down to the front slots.
Why:      step 3 issues its four loads in PTX before any Philox call, but ptxas sinks them: in
          its bf16 SASS the first LDG.E.128 comes after ~550 of the vector path's ~850
          instructions, whatever the register budget (launch bounds of 2, 4 or 8 blocks: same
          order; a __syncwarp between loads and generator: same). A warp has its bytes in flight
          only near the end of its life, and at 16 bits the generator is ~60% of the memory time.
          Triton's step 3 keeps its loads first (the first LDG.E.128 is the ~200th of 848
          instructions at BLOCK 4096) and reads ~3,020 GB/s where step 3 reads 2,880. ptxas
          schedules within a loop body, not across the back edge: code before a rolled loop stays
          before it, so here all four loads leave at the vector path's start (SASS: the first
          four instructions of it) and the whole generator runs under them.
          A first try kept the unrolled code and had thread 0 ask L2 for the block's tile with one
          cp.async.bulk.prefetch.L2 ahead of the generator: 2,658 GB/s bf16, 2,853 fp32 (below
          step 3; development run, H100).
Still:    the loop costs ~8% more instructions (920 against 848 for a thread's 32 bf16
          elements: the loop, the slot moves, addresses recomputed), and at 16 bits the SM's issue
          slots were already ~75% busy.
Limits:   none (64-bit indices and counters; misaligned pointers take the scalar path).
Layout:   contiguous
Roofline: ~15 integer ops per element vs 8 B (fp32) / 4 B (16-bit): memory-bound, <= 3.35 TB/s
Mirrors:  Triton step 03 (its loads are issued first by Triton's own schedule)
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
dropout_rolled(const T* __restrict__ x, T* __restrict__ y, int64_t n, DropParams d, bool aligned) {
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
    // A loop ptxas keeps rolled: the generator sits in its body, the loads before it, where the
    // scheduler cannot sink them. Each pass does kPass vectors from the front slots of v; the
    // others move down.
    constexpr int kPass = 2;
#pragma unroll 1
    for (int u0 = 0; u0 < kUnroll; u0 += kPass) {
#pragma unroll
      for (int i = 0; i < kPass; ++i) {
        const int u = u0 + i;
        // First element of this vector, then its groups: tile_start and kVec are multiples of 4.
        const int64_t first = tile_start + int64_t(u * kThreads + threadIdx.x) * kVec;
#pragma unroll
        for (int q = 0; q < kVec / 4; ++q) {
          const uint4 r = rosetta::philox4x32_10(d.offset + uint64_t(first / 4 + q), d.seed);
#pragma unroll
          for (int k = 0; k < 4; ++k)
            v[i].set(4 * q + k, drop(v[i].get(4 * q + k), rosetta::philox_word(r, k), d));
        }
        yv[u * kThreads + threadIdx.x] = v[i].raw;
      }
#pragma unroll
      for (int w = 0; w + kPass < kUnroll; ++w) v[w] = v[w + kPass];
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
    dropout_rolled<T><<<rosetta::ceil_div(in.numel, kTile), kThreads, 0, stream>>>(
        in.ptr<const T>(), out.ptr<T>(), in.numel, d, aligned);
  });
}

}  // namespace

cudaError_t dropout_04_rolled_generator(const rosetta::DropoutArgs& a, cudaStream_t stream) {
  return run(a.x, a.y, a.p, a.seed, a.offset, stream);
}

// The backward regenerates the forward's mask from the same (seed, offset).
cudaError_t dropout_04_rolled_generator_backward(const rosetta::DropoutBackwardArgs& a,
                                                 cudaStream_t stream) {
  return run(a.dy, a.dx, a.p, a.seed, a.offset, stream);
}
