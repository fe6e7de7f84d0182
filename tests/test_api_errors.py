"""Bad input gets a clear exception before any launch. CPU-only: CUDA tensors are never needed to
reach these checks (the "meta" device stands in for a second device)."""
import pytest
import torch

import rosetta


def two(n=8, dtype=torch.float32):
    return torch.randn(n).to(dtype), torch.randn(n).to(dtype)


def test_cuda_step_refuses_cpu_tensors():
    with pytest.raises(ValueError, match=r"vector_add/cuda/01_naive needs CUDA tensors, got a tensor on cpu"):
        rosetta.vector_add(*two(), backend="cuda", step=1)


def test_device_mismatch():
    x, y = two()
    with pytest.raises(ValueError, match=r"all inputs must be on one device, got x on cpu, y on meta"):
        rosetta.vector_add(x, y.to("meta"), backend="cuda")


def test_dtype_mismatch():
    x, y = two()
    with pytest.raises(ValueError, match=r"share one dtype, got x: torch.float32, y: torch.float16"):
        rosetta.vector_add(x, y.half(), backend="cuda")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_unsupported_dtype(dtype):
    with pytest.raises(ValueError, match=r"supports dtypes \['torch.float32', 'torch.float16', 'torch.bfloat16'\]"):
        rosetta.vector_add(*two(dtype=dtype), backend="cuda")


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"same shape, got \(8,\) and \(4, 2\)"):
        rosetta.vector_add(torch.randn(8), torch.randn(4, 2), backend="cuda")


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"y must be a torch.Tensor, got list"):
        rosetta.vector_add(torch.randn(3), [1.0, 2.0, 3.0], backend="cuda")


def test_unknown_backend_and_step():
    with pytest.raises(ValueError, match=r"unknown backend 'cupy'; expected one of \('cuda', 'triton'\)"):
        rosetta.vector_add(*two(), backend="cupy")
    with pytest.raises(ValueError, match=r"vector_add/cuda has steps 1..\d+, got step=99"):
        rosetta.vector_add(*two(), backend="cuda", step=99)
    with pytest.raises(ValueError, match=r"unknown op 'transpose'"):
        rosetta.variants("transpose")


def test_op_without_steps_says_so():
    if rosetta.variants("matmul", "cuda"):
        pytest.skip("matmul has steps now")
    with pytest.raises(ValueError, match="matmul has no cuda steps yet"):
        rosetta.matmul(torch.randn(2, 2), torch.randn(2, 2), backend="cuda")


def test_triton_on_cpu_without_interpreter_says_how(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        rosetta.vector_add(*two(), backend="triton")


def test_reduce_sum_bad_input():
    with pytest.raises(ValueError, match="reduce_sum/cuda/01_interleaved_divergent needs CUDA tensors"):
        rosetta.reduce_sum(torch.randn(5), backend="cuda", step=1)
    with pytest.raises(ValueError, match=r"supports dtypes .* got torch.int64"):
        rosetta.reduce_sum(torch.arange(5), backend="cuda")
    with pytest.raises(TypeError, match=r"takes 1 tensors \('x',\), got 2"):
        rosetta.variants("reduce_sum", "cuda")[0](torch.randn(3), torch.randn(3))
