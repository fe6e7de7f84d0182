// The WGMMA + TMA split-K pipeline's shared pieces (steps 14 and 17): the block's shape and
// shared-memory budget, and tensor maps for operands the copy engine cannot read as they are.
#pragma once

#include "hopper.cuh"

namespace rosetta::split_k {

namespace sm90 = rosetta::sm90;

constexpr int kBN = 128, kBK = 64;
constexpr int kSmemPerBlock = 227 * 1024;  // the opt-in maximum of one block
static_assert(kBK * 2 == 128, "one k-tile row is exactly one 128-byte swizzle row");

// kConsumers warpgroups of 64 rows each, then one producer warp: wgmma needs each warpgroup to
// start at a warp index divisible by 4, so the producer goes last. 64 accumulators per consumer
// thread need no setmaxnreg (90 registers a thread). kTileN: the tile's columns (step 14's narrow
// tiles: 64).
template <int kConsumers, int kTileN = kBN>
struct Config {
  static constexpr int kBM = 64 * kConsumers;
  static constexpr int kThreads = 128 * kConsumers + 32;
  static constexpr int kBytesA = kBM * kBK * 2, kBytesB = kTileN * kBK * 2;
  static constexpr int kStageBytes = kBytesA + kBytesB;  // 24 KB (64 x 128 tile), 32 KB (128 x 128), 16 (64 x 64)
  static constexpr int kStages = (kSmemPerBlock - 1024 - 160) / kStageBytes;  // 9 (216 KB), 7 (224 KB), 14 (224 KB)
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;  // + barriers, alignment slack
  static_assert(kStages >= 3, "a pipeline of 3+ stages");
  static_assert(kSmemBytes <= kSmemPerBlock, "fits the opt-in shared memory of one block");
};

// An operand the copy engine cannot describe (its leading stride not a multiple of 16 bytes, or its
// start off a 16-byte boundary: an odd K or N) is first copied into rows that are: the same
// major-ness, the leading stride rounded up to 8 elements, in the workspace. One read and one write
// of that operand, ~2 x 4.9 MB for B at 300 x 8192 x 300 (a few us at DRAM speed), where no TMA
// step could run at all. Block (x, y): 256 consecutive elements of rows y, y + gridDim.y, ...
template <typename T>
__global__ void __launch_bounds__(256)
repack_rows(const T* __restrict__ src, int64_t outer, int64_t inner, int64_t src_stride, T* __restrict__ dst,
            int64_t pitch) {
  const int64_t j = blockIdx.x * 256 + threadIdx.x;
  if (j >= inner) return;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) dst[o * pitch + j] = src[o * src_stride + j];
}

// x (row- or column-major, as the step's layout declares) as a copy the copy engine can read.
template <typename T>
rosetta::Tensor tma_readable_copy(const rosetta::Tensor& x, const rosetta::Workspace& workspace, cudaStream_t stream) {
  const int outer_dim = x.stride[1] == 1 ? 0 : 1;  // row-major: rows are the outer index
  const int64_t outer = x.size[outer_dim], inner = x.size[1 - outer_dim];
  const int64_t pitch = rosetta::ceil_div(inner, 8) * 8;  // 8 16-bit elements = 16 bytes
  T* const dst = workspace.get<T>(outer * pitch);
  const dim3 grid{unsigned(rosetta::ceil_div(inner, 256)), unsigned(std::min<int64_t>(outer, 65535))};
  repack_rows<T><<<grid, 256, 0, stream>>>(x.ptr<const T>(), outer, inner, x.stride[outer_dim], dst, pitch);
  rosetta::Tensor copy = x;
  copy.data = dst;
  copy.stride[outer_dim] = pitch;
  copy.stride[1 - outer_dim] = 1;
  return copy;
}

// A and B's tensor maps, through a readable copy where the operand itself cannot be described.
// a_box_rows, b_box_rows: the tile's rows of A and columns of B (a K-major operand's box).
template <typename T>
bool tma_operands(sm90::TmaOperand& a, sm90::TmaOperand& b, const rosetta::MatmulArgs& args, int a_box_rows,
                  cudaStream_t stream, int b_box_rows = kBN) {
  if (!sm90::make_tma_operand<T>(a, args.a, false, a_box_rows) &&
      !sm90::make_tma_operand<T>(a, tma_readable_copy<T>(args.a, args.workspace, stream), false, a_box_rows))
    return false;
  return sm90::make_tma_operand<T>(b, args.b, true, b_box_rows) ||
         sm90::make_tma_operand<T>(b, tma_readable_copy<T>(args.b, args.workspace, stream), true, b_box_rows);
}

}  // namespace rosetta::split_k
