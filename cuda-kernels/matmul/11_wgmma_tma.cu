/*
Step 11 — TMA tile copies and warpgroup MMA (wgmma), an mbarrier pipeline
Changed:  the copies and the MMAs both become asynchronous Hopper units. One thread hands each
          128 x 64 tile of A and B to the copy engine (cp.async.bulk.tensor.2d, UTMALDG) with a
          tensor map built on the host; the engine zero-fills out-of-bounds boxes and writes
          the 128-byte-swizzled layout wgmma reads (hopper.cuh spells out the layout and the
          descriptors). Each of the 2 warpgroups issues wgmma.m64n128k16 (HGMMA) for its 64 x 128
          half of the 128 x 128 tile, straight from shared memory: no ldmatrix, no fragment
          registers. A 4-stage ring of tiles, each with an mbarrier that completes when its
          32 KB have landed (expect_tx, try_wait.parity). Either major-ness of A and B is read
          in place (wgmma's transpose bits), so a.t() and b.t() need no copy.
Why:      step 10 spent issue slots on 8 LDSM + 32 HMMA + address math per warp and k16 slice,
          and mma.sync cannot reach Hopper's tensor peak (~990 TFLOP/s dense). One wgmma
          m64n128k16 is 262 kflop from a single instruction per warp; the copy of a whole tile
          is one instruction for one thread. Tile intensity is still 128 * 128 / (128 + 128)
          = 64 flop/B (32 KB per 2.1 Mflop k-tile): at ~700 TFLOP/s that is ~11 TB/s from L2,
          near its limit.
Still:    every thread both waits for copies and computes: one __syncthreads per k-tile before a
          stage is refilled, and the wgmma queue drains to 1 group at each one. The tile is too
          small for the L2 bandwidth. Step 12 gives copies and MMAs to different warpgroups,
          uses 128 x 256 tiles, and moves registers to the MMA warpgroups.
Limits:   each of A and B needs one unit stride (row- or column-major; a[:, ::2] is refused) and
          the copy engine's alignment: a 16-byte aligned base and the other stride a multiple
          of 8 elements. Other inputs return cudaErrorInvalidValue: step 10 takes them.
          M, N, K < 2^31.
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      tma_unaligned <= 0
*/
#include "hopper.cuh"

namespace {

namespace sm90 = rosetta::sm90;

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 4;
constexpr int kThreads = 256;  // 2 warpgroups: rows 0-63 and 64-127 of the tile
constexpr int kGroupM = 8;
constexpr int kStageBytes = (kBM + kBN) * kBK * 2;                      // 32 KB
constexpr int kSmemBytes = kStages * kStageBytes + kStages * 8 + 1024;  // + barriers, alignment slack
static_assert(kBK * 2 == 128, "one k-tile row is exactly one 128-byte swizzle row");
static_assert(kBM == 64 * (kThreads / 128), "one m64 wgmma row block per warpgroup");

template <typename T, bool kMnMajorA, bool kMnMajorB>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_wgmma_tma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     T* __restrict__ out, int M, int N, int K, bool pairs) {
  using TileA = sm90::OperandTile<kBM, kMnMajorA>;
  using TileB = sm90::OperandTile<kBN, kMnMajorB>;
  extern __shared__ unsigned char smem_raw[];
  // Tiles on 1024-byte boundaries (the swizzle atom): round the dynamic shared base up.
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  auto tile_a = [&](int s) { return smem + s * kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * kStageBytes + TileA::kBytes; };

  const int wg = threadIdx.x / 128;
  int tm, tn;
  rosetta::tile_coords<kGroupM>((M + kBM - 1) / kBM, (N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * kBM, n0 = tn * kBN;
  const int k_tiles = (K + kBK - 1) / kBK;

  // Stage s's barrier completes once per fill: 1 arrival (the issuing thread's expect_tx) plus
  // all 32 KB, partial boxes included (the engine counts the zero-filled bytes too).
  auto issue = [&](int kt) {
    const int s = kt % kStages;
    sm90::mbarrier_arrive_expect_tx(&full[s], kStageBytes);
    TileA::load(&map_a, tile_a(s), &full[s], m0, kt * kBK);
    TileB::load(&map_b, tile_b(s), &full[s], n0, kt * kBK);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) sm90::mbarrier_init(&full[s], 1);
    sm90::fence_barrier_init();
    for (int kt = 0; kt < min(kStages, k_tiles); ++kt) issue(kt);
  }
  __syncthreads();  // barriers initialised before anyone waits on them

  float d[64] = {};
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    sm90::mbarrier_wait(&full[s], (kt / kStages) % 2);  // fill number kt / kStages of stage s
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      sm90::wgmma<T, kBN, kMnMajorA, kMnMajorB>(d, TileA::descriptor(tile_a(s), 64 * wg, kk),
                                                      TileB::descriptor(tile_b(s), 0, kk));
    sm90::wgmma_commit();
    // k-tile kt - 1's MMAs have finished reading their stage; kt's keep the tensor cores busy.
    sm90::wgmma_wait<1>();
    __syncthreads();  // ... in both warpgroups: that stage may now be refilled
    if (threadIdx.x == 0 && kt >= 1 && kt - 1 + kStages < k_tiles) issue(kt - 1 + kStages);
  }
  sm90::wgmma_wait<0>();
  sm90::fence_accumulators(d);
  sm90::store_accumulators<T, kBN>(d, out, M, N, m0 + 64 * wg, n0, pairs);
}

}  // namespace

cudaError_t matmul_11_wgmma_tma(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return sm90::tc_matmul_launch(args, stream, [&](auto tag, int M, int N, int K) {
    using T = decltype(tag);
    sm90::TmaOperand a, b;
    if (!sm90::make_tma_operand<T>(a, args.a, false, kBM) || !sm90::make_tma_operand<T>(b, args.b, true, kBN))
      return cudaErrorInvalidValue;
    const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(args.out.data) % 4 == 0;
    const int64_t blocks = rosetta::ceil_div(M, kBM) * rosetta::ceil_div(N, kBN);
    sm90::with_majors(a.mn_major, b.mn_major, [&](auto mn_a, auto mn_b) {
      const auto kernel = matmul_wgmma_tma<T, mn_a, mn_b>;
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
      kernel<<<blocks, kThreads, kSmemBytes, stream>>>(a.map, b.map, args.out.ptr<T>(), M, N, K, pairs);
    });
    return cudaSuccess;
  });
}
