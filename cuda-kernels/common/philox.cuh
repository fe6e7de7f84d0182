// Counter-based random numbers that match Triton's bit for bit (triton/language/random.py, 3.6):
// the same seed and counter give the same four words here, in tl.randint4x and in tl.rand4x, so a
// CUDA step and a Triton step of one op draw the identical mask. Taught by the dropout ladder
// (step 1: one Philox call per element; step 2: one call per four elements).
//
//   philox4x32_10(counter, seed)  Philox4x32 with 10 rounds (Salmon et al., SC'11), keyed and
//                                 counted as tl.randint4x(seed, offset) does with an int64 offset:
//                                 counter words c0 = low 32 bits of the offset, c1 = high 32 bits
//                                 (an arithmetic shift: a negative offset has c1 = 0xffffffff),
//                                 c2 = c3 = 0; key k0 = low 32 bits of the seed, k1 = high 32 bits
//                                 (tl.philox casts the seed to uint64 first, so a negative seed is
//                                 sign-extended, as an int64_t already is).
//   uniform_float(word)           tl.random.uint_to_uniform_float: a float in [0, 1).
//
// Both are __host__ __device__ so that a CPU program can check them against Triton's interpreter.
// Not for cryptography; and Philox is a stream per (seed, counter): a caller that draws twice must
// advance the counter past everything the first draw used.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>  // uint4, __host__ / __device__

namespace rosetta {

// Triton's constants (random.py, the uint32 branch of philox_impl).
constexpr uint32_t kPhiloxKeyA = 0x9E3779B9u;    // golden ratio: the key schedule's Weyl step
constexpr uint32_t kPhiloxKeyB = 0xBB67AE85u;    // sqrt(3) - 1
constexpr uint32_t kPhiloxRoundA = 0xD2511F53u;  // the two round multipliers
constexpr uint32_t kPhiloxRoundB = 0xCD9E8D57u;
constexpr int kPhiloxRounds = 10;

__host__ __device__ __forceinline__ uint4 philox4x32_10(uint64_t counter, uint64_t seed) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
#pragma unroll
  for (int r = 0; r < kPhiloxRounds; ++r) {
    // One 32x32 -> 64-bit product gives both the multiply-high (umulhi) and the multiply-low
    // Triton takes separately: a single IMAD.WIDE.U32 on the GPU.
    const uint64_t pb = uint64_t(kPhiloxRoundB) * c2;
    const uint64_t pa = uint64_t(kPhiloxRoundA) * c0;
    c0 = uint32_t(pb >> 32) ^ c1 ^ k0;  // c1, c3: the previous round's words (Triton's order)
    c2 = uint32_t(pa >> 32) ^ c3 ^ k1;
    c1 = uint32_t(pb);
    c3 = uint32_t(pa);
    k0 += kPhiloxKeyA;
    k1 += kPhiloxKeyB;
  }
  return make_uint4(c0, c1, c2, c3);
}

// Word k (0..3) of a Philox result, k known at compile time after unrolling.
__host__ __device__ __forceinline__ uint32_t philox_word(const uint4& r, int k) {
  return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
}

// tl.random.uint_to_uniform_float for a uint32: read the word as int32, fold the negative half
// onto the positive (where(x < 0, -x - 1, x) == x ^ (x >> 31)), convert to float (round to
// nearest) and scale by Triton's constant, itself a double rounded once to fp32 as Triton's
// frontend rounds it. The largest result is 0.99999994f (< 1); the smallest 0 (for x = 0 or -1).
__host__ __device__ __forceinline__ float uniform_float(uint32_t word) {
  constexpr float kScale = static_cast<float>(4.6566127342e-10);  // ~ (2^23 - 1) / 2^23 / 2^31
  const int32_t s = int32_t(word);
  const int32_t folded = s ^ (s >> 31);
  return static_cast<float>(folded) * kScale;
}

}  // namespace rosetta
