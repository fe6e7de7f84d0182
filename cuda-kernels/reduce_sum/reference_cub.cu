// Not a step: cub::DeviceReduce::Sum, the CUDA library's reduction, as a reference tier beside
// torch.sum (built into the same extension; torch.ops.rosetta.reduce_sum_cub).
#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/transform_iterator.h>

#include "rosetta.cuh"

namespace {

template <typename T>
struct ToFloat {
  __device__ float operator()(T v) const { return rosetta::to_float(v); }
};

}  // namespace

// The workspace doubles as CUB's temporary storage (it asks for a few KB).
cudaError_t reduce_sum_cub(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaMemsetAsync(a.out, 0, sizeof(float), stream);
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto in = thrust::make_transform_iterator(static_cast<const T*>(a.x), ToFloat<T>{});
    size_t bytes = 0;
    status = cub::DeviceReduce::Sum(nullptr, bytes, in, a.out, a.n, stream);  // size query only
    if (status == cudaSuccess && bytes > size_t(a.workspace_floats) * sizeof(float)) {
      status = cudaErrorInvalidValue;
    }
    if (status == cudaSuccess) status = cub::DeviceReduce::Sum(a.workspace, bytes, in, a.out, a.n, stream);
  });
  return status != cudaSuccess ? status : launched;
}
