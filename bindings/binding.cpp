// The one binding: every CUDA launcher becomes a function of the extension module,
// `<name>_out(inputs..., outputs..., params...)` (pybind11 hands the tensors over; the functional torch ops that
// tracing, opcheck and autograd see are Python custom ops around these functions).
// What is per step or per op (the launcher declarations, the functions that fill each op's
// argument struct) is generated from the specs and the step files into rosetta_binding.inc by
// bindings/cuda_codegen.py; this file holds what every launch shares: turning an at::Tensor into a
// rosetta::Tensor view with its checks, the workspace, the stream.
// Python (bindings/dispatch.py) gives the friendly input errors first; the checks here guard
// direct callers against bad memory accesses.
#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "rosetta.cuh"

namespace rosetta_binding {

enum class Layout : int { contiguous = 0, rows = 1, rows_or_cols = 2, tma = 3, any = 4, tma_rows = 5 };  // ops/spec.py LAYOUTS

class Call {
 public:
  Call(const char* name, const at::Tensor& out, int allowed_dtypes, Layout layout)
      : name_(name), device_(out.device()), guard_(out.device()), allowed_(allowed_dtypes), layout_(layout) {
    TORCH_CHECK(out.is_cuda(), name_, ": tensors must be CUDA tensors");
  }

  // check_dtype false: a tensor whose dtype the op fixes (fp32 statistics), not the step's choice
  rosetta::Tensor input(const at::Tensor& t, const char* what, bool check_dtype) const {
    TORCH_CHECK(fits(t), name_, ": ", what, " has strides ", t.strides(), ", which this step's layout does not take");
    return view(t, what, check_dtype);
  }

  rosetta::Tensor output(const at::Tensor& t, const char* what) const {
    TORCH_CHECK(t.is_contiguous(), name_, ": the output ", what, " must be contiguous");
    return view(t, what, false);
  }

  // The output t as the kernel sees it: t's memory in `shape`'s sizes and strides (a contiguous
  // meta tensor of t's element count, e.g. a 0-dim sum seen as one element), with no view op.
  rosetta::Tensor output(const at::Tensor& t, const at::Tensor& shape, const char* what) const {
    TORCH_CHECK(shape.numel() == t.numel() && shape.is_contiguous() && shape.dim() <= rosetta::kMaxDims, name_,
                ": the kernel view of ", what, " must be contiguous with its ", t.numel(), " elements");
    rosetta::Tensor v = output(t, what);
    v.dim = int(shape.dim());
    for (int d = 0; d < v.dim; ++d) {
      v.size[d] = shape.size(d);
      v.stride[d] = shape.stride(d);
    }
    return v;
  }

  rosetta::Workspace workspace() { return {&Call::allocate, this}; }
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(device_.index()); }

  void check(cudaError_t err) const {
    TORCH_CHECK(err == cudaSuccess, name_, ": launch failed: ", cudaGetErrorString(err));
  }

 private:
  bool fits(const at::Tensor& t) const {
    if (layout_ == Layout::any || t.numel() <= 1) return true;
    if (layout_ == Layout::rows) return t.dim() == 0 || t.stride(-1) == 1 || t.size(-1) == 1;
    if (layout_ == Layout::rows_or_cols || layout_ == Layout::tma || layout_ == Layout::tma_rows) {
      if (t.dim() < 2) return t.stride(-1) == 1;
      const int64_t rows = t.size(-2), cols = t.size(-1);
      const bool row_major = t.stride(-1) == 1 && t.stride(-2) >= cols;
      const bool column_major = layout_ != Layout::tma_rows && t.stride(-2) == 1 && t.stride(-1) >= rows;
      if (!row_major && !column_major) return false;
      if (layout_ == Layout::rows_or_cols) return true;
      // tma: the pitch and every outer stride (batch, heads) whole 16-byte units, the start too
      const int64_t pitch = row_major ? t.stride(-2) : t.stride(-1);
      const auto whole = [&](int64_t stride) { return stride > 0 && (stride * t.element_size()) % 16 == 0; };
      bool ok = whole(pitch) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
      for (int64_t d = 0; d + 2 < t.dim(); ++d) ok = ok && (t.size(d) <= 1 || whole(t.stride(d)));
      return ok;
    }
    return t.is_contiguous();
  }

  rosetta::Tensor view(const at::Tensor& t, const char* what, bool check_dtype) const {
    TORCH_CHECK(t.device() == device_, name_, ": ", what, " is on ", t.device(), ", expected ", device_);
    TORCH_CHECK(t.dim() <= rosetta::kMaxDims, name_, ": ", what, " has ", t.dim(), " dims, at most ",
                rosetta::kMaxDims);
    rosetta::Tensor v{};
    v.data = t.data_ptr();
    switch (t.scalar_type()) {
      case at::kFloat: v.dtype = rosetta::DType::f32; break;
      case at::kHalf: v.dtype = rosetta::DType::f16; break;
      case at::kBFloat16: v.dtype = rosetta::DType::bf16; break;
      default: TORCH_CHECK(false, name_, ": unsupported dtype ", t.scalar_type());
    }
    TORCH_CHECK(!check_dtype || (allowed_ >> int(v.dtype)) & 1, name_, ": this step does not take ", t.scalar_type());
    v.dim = int(t.dim());
    v.numel = t.numel();
    for (int d = 0; d < v.dim; ++d) {
      v.size[d] = t.size(d);
      v.stride[d] = t.stride(d);
    }
    return v;
  }

  // Workspace memory from torch's caching allocator: freed when the call returns, which is safe
  // because the allocator reuses a block only after the work queued on its stream.
  static void* allocate(void* self, int64_t bytes) {
    auto* call = static_cast<Call*>(self);
    call->scratch_.push_back(at::empty({std::max<int64_t>(bytes, 1)},
                                       at::TensorOptions().dtype(at::kByte).device(call->device_)));
    return call->scratch_.back().data_ptr();
  }

  const char* name_;
  at::Device device_;
  c10::cuda::CUDAGuard guard_;
  int allowed_;
  Layout layout_;
  std::vector<at::Tensor> scratch_;
};

// A new output shaped as `like` (a meta tensor: sizes, strides, dtype) on `input`'s device, from
// the caching allocator without a round trip through the dispatcher (what at::empty_strided's CUDA
// kernel calls; its only other work, filling under torch.use_deterministic_algorithms, is moot for
// an output the kernel writes whole).
inline at::Tensor empty_as(const at::Tensor& like, const at::Tensor& input) {
  return at::detail::empty_strided_cuda(like.sizes(), like.strides(), like.scalar_type(), input.device());
}

}  // namespace rosetta_binding

#include "rosetta_binding.inc"
