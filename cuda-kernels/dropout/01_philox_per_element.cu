/*
Step 1 — one Philox call per element
Changed:  the starting point. The op's mask, the same in every step of both ladders: element i
          (of the flat tensor) takes word i % 4 of Philox4x32-10(counter = offset + i / 4, key =
          seed) -- Triton's tl.randint4x(seed, offset + i // 4), bit for bit (common/philox.cuh)
          -- turns it into u in [0, 1) as tl.uint_to_uniform_float does, and is kept when u > p
          (strictly: the Triton dropout tutorial's test). Kept elements are x * scale, scale =
          fp32(1 / (1 - p)) (the division in double, on the host), the product in fp32, then
          rounded to y's dtype; dropped ones are 0 (p = 1 drops all; x * inf is never stored).
          Backward: the same kernel on dy -> dx, the mask drawn again from (seed, offset) rather
          than stored. Here thread i runs the whole generator for element i and keeps one word.
Why:      no mask tensor: the forward moves 2 x |x| bytes (one read, one write), not 2 x |x| plus
          a mask, and the backward as much again. The price is the generator: Philox4x32-10 is
          10 rounds of two 32x32->64 multiplies (one IMAD.WIDE.U32 each gives umulhi and mul)
          and two 3-way xors (LOP3), ~60 integer instructions per call. One call per element
          against 8 bytes (fp32) or 4 bytes (fp16/bf16) moved: H100's IMAD pipe does 64
          lanes/clk/SM (a WIDE costs ~2), so ~0.6 SM-clocks per element, ~370 G elements/s over
          132 SMs at 1.75 GHz: ~3.0 TB/s at fp32 and ~1.5 TB/s at 16 bits -- compute-bound.
Still:    three of every four words each call computes are thrown away: the four threads of a
          group run the same call. And one scalar load and store per thread (vector_add step 1).
Limits:   none (64-bit indices: n may exceed 2^31; the counter is 64-bit, so offset + i / 4 may
          pass 2^32 and carries into Philox's second counter word, as in Triton).
Layout:   contiguous
Roofline: ~60 integer ops per element vs 8 B (fp32) / 4 B (16-bit): IMAD-bound, ~3.0 / ~1.5 TB/s
Mirrors:  Triton step 01 (one tl.randint4x per element, one word kept)
*/
#include <cmath>

#include "philox.cuh"
#include "rosetta.cuh"

namespace {

// What every thread needs to draw and apply the mask; the same for forward and backward.
struct DropParams {
  uint64_t seed;    // Philox key: k0 = low 32 bits, k1 = high 32 bits
  uint64_t offset;  // counter of element 0's group; element i uses offset + i / 4
  float p;          // fp32(p): u is compared with it in fp32, as in Triton
  float scale;      // fp32(1 / (1 - p)), divided in double
};

DropParams drop_params(double p, int64_t seed, int64_t offset) {
  return {uint64_t(seed), uint64_t(offset), float(p), float(p < 1.0 ? 1.0 / (1.0 - p) : INFINITY)};
}

// The op's rule for one element, given its Philox word. A select, not x * keep * scale: at
// p = 1 scale is inf, and 0 * inf would be NaN.
__device__ __forceinline__ float drop(float x, uint32_t word, const DropParams& d) {
  return rosetta::uniform_float(word) > d.p ? x * d.scale : 0.0f;
}

template <typename T>
__global__ void dropout_per_element(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                    DropParams d) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // 64-bit before the multiply
  if (i >= n) return;
  // The full 10-round generator for one word: the three others are computed and dropped.
  const uint4 r = rosetta::philox4x32_10(d.offset + uint64_t(i / 4), d.seed);
  y[i] = rosetta::from_float<T>(drop(rosetta::to_float(x[i]), rosetta::philox_word(r, int(i % 4)), d));
}

cudaError_t run(const rosetta::Tensor& in, const rosetta::Tensor& out, double p, int64_t seed,
                int64_t offset, cudaStream_t stream) {
  if (in.numel == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = rosetta::ceil_div(in.numel, kThreads);
  const DropParams d = drop_params(p, seed, offset);
  return rosetta::dispatch_dtype(in.dtype, [&](auto tag) {
    using T = decltype(tag);
    dropout_per_element<T><<<blocks, kThreads, 0, stream>>>(in.ptr<const T>(), out.ptr<T>(), in.numel, d);
  });
}

}  // namespace

cudaError_t dropout_01_philox_per_element(const rosetta::DropoutArgs& a, cudaStream_t stream) {
  return run(a.x, a.y, a.p, a.seed, a.offset, stream);
}

// The backward regenerates the forward's mask from the same (seed, offset): dx = dy masked and
// scaled exactly as y = x was.
cudaError_t dropout_01_philox_per_element_backward(const rosetta::DropoutBackwardArgs& a,
                                                   cudaStream_t stream) {
  return run(a.dy, a.dx, a.p, a.seed, a.offset, stream);
}
