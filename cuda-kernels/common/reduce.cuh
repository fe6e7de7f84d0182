// The multi-launch driver shared by reduce_sum steps 1-8: run one "pass" kernel (one partial sum
// per block) over the input, then over its partials, until a single block is left, whose result
// goes straight to *out. Every pass after the first reads fp32 partials.
#pragma once

#include "rosetta.cuh"

namespace rosetta {

// blocks_for(n): the grid a pass uses for n inputs. pass(in, n, dst, blocks): launch the step's
// kernel on `in` (a typed pointer: the input's element type first, float after), writing one
// float per block to dst. Partials ping-pong between two regions of the workspace.
template <typename BlocksFor, typename Pass>
cudaError_t reduce_in_passes(const ReduceSumArgs& a, cudaStream_t stream, BlocksFor blocks_for, Pass pass) {
  if (a.x.numel == 0) return cudaMemsetAsync(a.out.ptr<float>(), 0, sizeof(float), stream);  // the empty sum
  const int64_t first = blocks_for(a.x.numel);
  // One block writes the sum straight to out: no partials, so no workspace (an allocation a call),
  // and no regions to point into it.
  float* regions[2] = {nullptr, nullptr};
  if (first > 1) {
    regions[0] = a.workspace.get<float>(first + blocks_for(first));
    regions[1] = regions[0] + first;
  }
  const void* in = a.x.data;
  DType dtype = a.x.dtype;
  int64_t n = a.x.numel;
  for (int which = 0;; which ^= 1) {
    const int64_t blocks = blocks_for(n);
    float* dst = blocks == 1 ? a.out.ptr<float>() : regions[which];
    const cudaError_t err = dispatch_dtype(dtype, [&](auto tag) {
      pass(static_cast<const decltype(tag)*>(in), n, dst, blocks);
    });
    if (err != cudaSuccess || blocks == 1) return err;
    in = dst;
    dtype = DType::f32;
    n = blocks;
  }
}

}  // namespace rosetta
