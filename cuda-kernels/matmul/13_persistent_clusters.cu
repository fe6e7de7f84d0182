/*
Step 13 — persistent tiles, 2-CTA clusters sharing B by TMA multicast, TMA-store epilogue
Changed:  step 12's warp-specialized block, made persistent: the grid is as many 2-CTA clusters
          as fit on the chip, each walking output tiles in grouped order, with stage and
          barrier-phase counters running on across tiles. The two CTAs of a cluster compute
          vertically adjacent 128 x kBN tiles that share their B tile: each loads half of it and
          multicasts it to both (cp.async.bulk.tensor .multicast::cluster), and a stage is
          refilled only when the consumers of both CTAs have released it (remote mbarrier
          arrivals). The epilogue writes bf16/fp16 into 128-byte-swizzled shared memory and
          hands it to the copy engine (cp.async.bulk.tensor store, UTMASTG) one 64 x 64 box at a
          time through two buffers (box j is converted while box j - 1 is stored), while the
          producer is already filling the stages with the next tile. Staging two boxes instead
          of the whole tile frees 32 KB: enough for a 4th 48 KB stage at 128 x 256. The tile is
          128 x 256, 128 x 192 or 192 x 192 (three consumer warpgroups, each staging one box so
          that 4 stages fit), whichever makes waves of cluster pairs x tile area smallest, ties
          to the larger tile. 3000^3: 2 waves of 192 x 192 pairs = 3 waves of 128 x 192, with
          14% fewer bytes from L2 per flop; the other shapes keep 128 x 256. The kernel, its
          launch and this pick live in common/gemm_sm90.cuh, shared with linear_gelu (which
          fuses its epilogue math into it): this step runs it with the identity epilogue.
Why:      step 12 paid, per 128 x 256 tile, a pipeline fill and an epilogue with the tensor
          cores idle, and every block read its B tile from L2 alone. Now the next tile's loads
          overlap this tile's epilogue; L2 -> SM traffic per k-tile and CTA drops from 48 KB to
          16 + 16 KB (A own, half of B): 128 * 256 / (128 + 128) = 128 flop/B. Stores leave
          as whole 128-byte rows. The 4th stage matters because a stage is refilled only when
          both CTAs of the pair released it, so either CTA's hiccup stalls the other: 3 stages
          of 128 x 256 measured 190 us at 4096^3 in development, 4 stages 183-185 us.
Still:    the consumer warpgroups do their epilogues together, so the tensor cores idle
          while they convert and store (ping-pong consumers would overlap one's epilogue with
          the other's MMAs); the tile shape is picked per problem from three, without stream-K
          for the last partial wave. Rows whose byte pitch is not a multiple of 128 (K or N =
          3000: 6000 B) make most 128-byte box rows straddle two L2 lines. With 256-byte L2
          promotion and 3 stages of 192 x 192 the loads set the time there (development, bf16
          3000^3: 100 us, loads alone 97-98, cuBLAS 81); 128-byte promotion (hopper.cuh) took
          the loads alone to 81-84 us and the kernel to 94, and the 4th stage, worth nothing
          while the loads were the wall, to 84: see KERNEL_LOG.
Limits:   as step 11: each of A and B needs one unit stride and the copy engine's alignment
          (16-byte aligned base, the other stride a multiple of 8 elements); other inputs return
          cudaErrorInvalidValue (step 10 takes them). Outputs whose rows are not 16-byte
          multiples (N % 8 != 0) take masked register stores instead of TMA stores.
          M, N, K < 2^31.
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      tma_unaligned <= 0
*/
#include "gemm_sm90.cuh"

cudaError_t matmul_13_persistent_clusters(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  namespace sm90 = rosetta::sm90;
  return sm90::tc_matmul_launch(args, stream, [&](auto tag, int M, int N, int K) {
    using T = decltype(tag);
    // out is M x N contiguous: row stride N
    return sm90::gemm::run<T>(args.a, args.b, args.out.ptr<T>(), N, M, N, K, sm90::gemm::Identity{}, stream);
  });
}
