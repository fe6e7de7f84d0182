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

// CUB's temporary storage (a few KB) comes from the launch's workspace.
cudaError_t reduce_sum_cub(const rosetta::ReduceSumArgs& a, cudaStream_t stream) {
  if (a.x.numel == 0) return cudaMemsetAsync(a.out.ptr<float>(), 0, sizeof(float), stream);
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto in = thrust::make_transform_iterator(a.x.ptr<const T>(), ToFloat<T>{});
    size_t bytes = 0;
    float* out = a.out.ptr<float>();
    status = cub::DeviceReduce::Sum(nullptr, bytes, in, out, a.x.numel, stream);  // size query only
    if (status == cudaSuccess) {
      status = cub::DeviceReduce::Sum(a.workspace.get<char>(int64_t(bytes)), bytes, in, out, a.x.numel, stream);
    }
  });
  return status != cudaSuccess ? status : launched;
}
