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
    with pytest.raises(ValueError, match=rf"no vector_add/cuda step takes {dtype}; the steps take"):
        rosetta.vector_add(*two(dtype=dtype), backend="cuda")


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"same shape, got \(8,\) and \(4, 2\)"):
        rosetta.vector_add(torch.randn(8), torch.randn(4, 2), backend="cuda")


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"y must be a torch.Tensor, got list"):
        rosetta.vector_add(torch.randn(3), [1.0, 2.0, 3.0], backend="cuda")
    # a NumPy array has a dtype too, but not a torch one: refused by its type, not its dtype
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got ndarray"):
        rosetta.softmax(torch.randn(2, 3).numpy(), backend="cuda")


def test_unknown_backend_and_step():
    with pytest.raises(ValueError, match=r"unknown backend 'cupy'; expected one of \('cuda', 'triton'\)"):
        rosetta.vector_add(*two(), backend="cupy")
    with pytest.raises(ValueError, match=r"vector_add/cuda has steps 1..\d+, got step=99"):
        rosetta.vector_add(*two(), backend="cuda", step=99)
    with pytest.raises(ValueError, match=r"unknown op 'transpose'"):
        rosetta.variants("transpose")


def test_triton_on_cpu_without_interpreter_says_how(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        rosetta.vector_add(*two(), backend="triton")


def test_reduce_sum_bad_input():
    with pytest.raises(ValueError, match="reduce_sum/cuda/01_interleaved_divergent needs CUDA tensors"):
        rosetta.reduce_sum(torch.randn(5), backend="cuda", step=1)
    with pytest.raises(ValueError, match=r"no reduce_sum/cuda step takes torch.int64"):
        rosetta.reduce_sum(torch.arange(5), backend="cuda")
    with pytest.raises(TypeError, match=r"takes 1 tensors \('x',\), got 2"):
        rosetta.variants("reduce_sum", "cuda")[0](torch.randn(3), torch.randn(3))


def test_matmul_bad_input():
    with pytest.raises(ValueError, match=r"must be 2-D \(M, K\) and \(K, N\), got \(3,\) and \(3, 2\)"):
        rosetta.matmul(torch.randn(3), torch.randn(3, 2), backend="cuda", step=1)
    with pytest.raises(ValueError, match=r"must be 2-D .* got \(2, 3, 4\)"):
        rosetta.matmul(torch.randn(2, 3, 4), torch.randn(4, 2), backend="cuda", step=1)
    with pytest.raises(ValueError, match=r"inner dimensions differ: a is \(4, 3\), b is \(5, 2\)"):
        rosetta.matmul(torch.randn(4, 3), torch.randn(5, 2), backend="cuda", step=1)
    with pytest.raises(ValueError, match="share one dtype"):
        rosetta.matmul(torch.randn(4, 3), torch.randn(3, 2).half(), backend="cuda", step=1)
    with pytest.raises(ValueError, match="matmul/cuda/01_naive needs CUDA tensors"):
        rosetta.matmul(torch.randn(4, 3), torch.randn(3, 2), backend="cuda", step=1)


def test_softmax_bad_input():
    with pytest.raises(ValueError, match="at least one dimension"):
        rosetta.softmax(torch.tensor(1.0), backend="cuda", step=1)
    with pytest.raises(ValueError, match="softmax/cuda/01_thread_per_row needs CUDA tensors"):
        rosetta.softmax(torch.randn(3, 4), backend="cuda", step=1)


def test_a_dtype_no_step_takes_names_the_steps_that_do():
    fp32_only = [v for v in rosetta.variants() if v.dtypes == (torch.float32,)]
    if not fp32_only:
        pytest.skip("every step takes every dtype")
    v = fp32_only[0]
    inputs = [t.half() for t in rosetta.ops.SPECS[v.op].forward.make_inputs(
        rosetta.ops.SPECS[v.op].cpu_shapes[1], torch.float32, "cpu", torch.Generator().manual_seed(0))]
    with pytest.raises(ValueError, match=rf"{v.label} takes \['torch.float32'\], got torch.float16; "):
        v(*inputs)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_norm_refuses_rows_of_no_elements(op):
    x = torch.randn(3, 0)
    args = (x, torch.randn(0)) if op == "rms_norm" else (x, torch.randn(0), torch.randn(0))
    with pytest.raises(ValueError, match=r"x of shape \(3, 0\) does not have \(or is empty: rows of no elements"):
        getattr(rosetta, op)(*args, backend="cuda")
