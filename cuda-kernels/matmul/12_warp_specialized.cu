/*
Step 12 — warp specialization: a producer warpgroup for TMA, two consumer warpgroups for wgmma
Changed:  step 11's threads each did everything. Now warpgroup 0 only issues copies (one thread)
          and warpgroups 1-2 only issue wgmma: each stage has a "full" barrier (copy landed,
          expect_tx) and an "empty" one (both consumers done reading it), so neither side ever
          waits at a block-wide barrier. The tile grows to 128 x 256 (each consumer
          m64n256k16, 128 fp32 accumulators per thread) in 4 stages of 48 KB, and setmaxnreg
          moves registers from the producer (down to 40) to the consumers (up to 232) under
          __launch_bounds__(384, 1).
Why:      step 11's __syncthreads per k-tile let the slower warpgroup stall the other and the
          refill wait on the whole block. With roles split, copies run up to 4 stages ahead and
          each consumer keeps one wgmma group in flight. The bigger tile cuts traffic per flop:
          128 * 256 / (128 + 256) = 85 flop/B (48 KB per 4.2 Mflop k-tile) against 64: at
          ~700 TFLOP/s ~8 TB/s from L2 instead of ~11. 128 accumulators need more than the
          168 registers a 384-thread block gets per thread: hence setmaxnreg.
Still:    one block per tile: each block pays the pipeline fill and a register-to-global
          epilogue (4-byte stores, half-used sectors) with the tensor cores idle, and neighbouring
          blocks fetch the same B tile from L2 separately. Step 13 keeps blocks resident over
          many tiles, pairs them in clusters that share B through TMA multicast, and writes out
          through shared memory with TMA stores.
Limits:   as step 11: each of A and B needs one unit stride and the copy engine's alignment
          (16-byte aligned base, the other stride a multiple of 8 elements); other inputs return
          cudaErrorInvalidValue (step 10 takes them). M, N, K < 2^31.
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      tma_unaligned <= 0
*/
#include "hopper.cuh"

namespace {

namespace sm90 = rosetta::sm90;

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4;
constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers);  // 384
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
constexpr int kGroupM = 8;
constexpr int kStageBytes = (kBM + kBN) * kBK * 2;                          // 48 KB
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + barriers, alignment slack
static_assert(kBK * 2 == 128, "one k-tile row is exactly one 128-byte swizzle row");
static_assert(kBM == 64 * kConsumers, "one m64 wgmma row block per consumer warpgroup");
static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "the register file holds both budgets");

template <typename T, bool kMnMajorA, bool kMnMajorB>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_warp_specialized(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                            T* __restrict__ out, int M, int N, int K, bool pairs) {
  using TileA = sm90::OperandTile<kBM, kMnMajorA>;
  using TileB = sm90::OperandTile<kBN, kMnMajorB>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  auto tile_a = [&](int s) { return smem + s * kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * kStageBytes + TileA::kBytes; };

  int tm, tn;
  rosetta::tile_coords<kGroupM>((M + kBM - 1) / kBM, (N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * kBM, n0 = tn * kBN;
  const int k_tiles = (K + kBK - 1) / kBK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);            // the producer's expect_tx, then the bytes
      sm90::mbarrier_init(&empty[s], kConsumers);  // one arrival per consumer warpgroup
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles only meet at mbarriers

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::set_max_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        // Fill f = kt / kStages of stage s waits for the consumers' release of fill f - 1
        // (phase parity (f - 1) % 2; for f = 0 the fresh barrier's parity-1 phase passes).
        sm90::mbarrier_wait(&empty[s], (kt / kStages + 1) % 2);
        sm90::mbarrier_arrive_expect_tx(&full[s], kStageBytes);
        TileA::load(&map_a, tile_a(s), &full[s], m0, kt * kBK);
        TileB::load(&map_b, tile_b(s), &full[s], n0, kt * kBK);
      }
    }
  } else {
    sm90::set_max_registers<kConsumerRegs>();
    const int row0 = 64 * (wg - 1);
    float d[128] = {};
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % kStages;
      sm90::mbarrier_wait(&full[s], (kt / kStages) % 2);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        sm90::wgmma<T, kBN, kMnMajorA, kMnMajorB>(d, TileA::descriptor(tile_a(s), row0, kk),
                                                        TileB::descriptor(tile_b(s), 0, kk));
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();  // k-tile kt - 1's group is done: release its stage to the producer
      if (kt >= 1 && threadIdx.x % 128 == 0) sm90::mbarrier_arrive(&empty[(kt - 1) % kStages]);
    }
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(d);
    sm90::store_accumulators<T, kBN>(d, out, M, N, m0 + row0, n0, pairs);
  }
}

}  // namespace

cudaError_t matmul_12_warp_specialized(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return sm90::tc_matmul_launch(args, stream, [&](auto tag, int M, int N, int K) {
    using T = decltype(tag);
    sm90::TmaOperand a, b;
    if (!sm90::make_tma_operand<T>(a, args.a, false, kBM) || !sm90::make_tma_operand<T>(b, args.b, true, kBN))
      return cudaErrorInvalidValue;
    const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(args.out.data) % 4 == 0;
    const int64_t blocks = rosetta::ceil_div(M, kBM) * rosetta::ceil_div(N, kBN);
    sm90::with_majors(a.mn_major, b.mn_major, [&](auto mn_a, auto mn_b) {
      const auto kernel = matmul_warp_specialized<T, mn_a, mn_b>;
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
      kernel<<<blocks, kThreads, kSmemBytes, stream>>>(a.map, b.map, args.out.ptr<T>(), M, N, K, pairs);
    });
    return cudaSuccess;
  });
}
