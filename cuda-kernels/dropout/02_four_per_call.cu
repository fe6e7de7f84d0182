/*
Step 2 — one Philox call per four elements
Changed:  thread g owns the four elements 4g .. 4g + 3 (one Philox counter's group): one call,
          all four words used, word k for element 4g + k -- step 1's mask, bit for bit. The group
          moves as one vector (16 bytes of fp32, 8 bytes of fp16/bf16) when x and y are aligned to
          a group; the last partial group and misaligned tensors take scalar accesses.
Why:      step 1 computes four words per element and keeps one. Using all four divides the
          generator's ~60 instructions (20 IMAD.WIDE) by four: ~15 per element, ~0.16 SM-clocks,
          ~1.5 T elements/s of Philox over the chip -- 3.5x the 419 G elements/s that 3.35 TB/s
          feeds at fp32 (8 B per element), 1.8x the 838 G/s at 16 bits. The kernel is now
          memory-bound, and a group is naturally a vector: a quarter of step 1's memory
          instructions.
Still:    one vector per thread and operand, 8-byte ones at 16 bits, and the Philox call sits
          between the load and the store: each warp has few bytes in flight (Little's law wants
          ~18 KB per SM at ~3.35 TB/s x ~700 ns). Step 3 moves several 16-byte vectors per thread.
Limits:   none (64-bit indices and counters, as step 1; misaligned pointers go scalar).
Layout:   contiguous
Roofline: ~15 integer ops per element vs 8 B (fp32) / 4 B (16-bit): memory-bound, <= 3.35 TB/s
Mirrors:  Triton step 02 (tl.rand4x on BLOCK / 4 counters, interleaved)
*/
#include <cmath>
#include <type_traits>

#include "philox.cuh"
#include "rosetta.cuh"

namespace {

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

// One group of four elements as one access: 16 bytes of fp32, 8 bytes of fp16/bf16.
template <typename T>
using Group = std::conditional_t<sizeof(T) == 4, uint4, uint2>;

template <typename T>
__global__ void dropout_four_per_call(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                      DropParams d, bool aligned) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first = 4 * g;
  if (first >= n) return;
  const uint4 r = rosetta::philox4x32_10(d.offset + uint64_t(g), d.seed);  // all four words used
  if (aligned && first + 4 <= n) {
    Group<T> v = reinterpret_cast<const Group<T>*>(x)[g];
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      e[k] = rosetta::from_float<T>(drop(rosetta::to_float(e[k]), rosetta::philox_word(r, k), d));
    reinterpret_cast<Group<T>*>(y)[g] = v;
    return;
  }
  for (int k = 0; k < 4 && first + k < n; ++k)  // the partial last group, or misaligned data
    y[first + k] = rosetta::from_float<T>(drop(rosetta::to_float(x[first + k]), rosetta::philox_word(r, k), d));
}

cudaError_t run(const rosetta::Tensor& in, const rosetta::Tensor& out, double p, int64_t seed,
                int64_t offset, cudaStream_t stream) {
  if (in.numel == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = rosetta::ceil_div(rosetta::ceil_div(in.numel, 4), kThreads);
  const DropParams d = drop_params(p, seed, offset);
  return rosetta::dispatch_dtype(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Group g starts at element 4g, so its vector is aligned when the base pointers are.
    const auto fits = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % sizeof(Group<T>) == 0; };
    const bool aligned = fits(in.data) && fits(out.data);
    dropout_four_per_call<T><<<blocks, kThreads, 0, stream>>>(in.ptr<const T>(), out.ptr<T>(),
                                                              in.numel, d, aligned);
  });
}

}  // namespace

cudaError_t dropout_02_four_per_call(const rosetta::DropoutArgs& a, cudaStream_t stream) {
  return run(a.x, a.y, a.p, a.seed, a.offset, stream);
}

// The backward regenerates the forward's mask from the same (seed, offset).
cudaError_t dropout_02_four_per_call_backward(const rosetta::DropoutBackwardArgs& a,
                                              cudaStream_t stream) {
  return run(a.dy, a.dx, a.p, a.seed, a.offset, stream);
}
