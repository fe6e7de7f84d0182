"""Triton softmax step 5's windows on the CPU (TRITON_INTERPRET=1): the host's choice of window
(window_of), and the kernels on the cases the public call never makes, an output that itself
starts inside a 16-byte group, checked against fp64 with the elements around the output untouched.
The vector widths are tested from the PTX in test_triton_vectors.py; the GPU tests run every step
on every test shape."""
import pytest
import torch

import rosetta
from rosetta.torch_ops import triton_module


@pytest.fixture(scope="module")
def step5():
    return triton_module(next(v for v in rosetta.variants(op="softmax", backend="triton") if v.step == 5))


def test_window_of(step5):
    odd = torch.empty(4, 50257, dtype=torch.bfloat16)
    # rows start anywhere in a group: windows, edge tiles, 7 more positions a row
    assert step5.window_of(torch.empty_like(odd), odd) == (0, True, True, 50257 + 7)
    aligned = torch.empty(4, 4096, dtype=torch.bfloat16)
    assert step5.window_of(torch.empty_like(aligned), aligned) == (0, True, False, 4096)  # step 4's SASS
    one_row = torch.empty(1, 1001)  # fp32: V = 4; the one row starts on the boundary
    assert step5.window_of(torch.empty_like(one_row), one_row) == (0, True, True, 1001)
    wide = torch.empty(4, 1004)[:, :1001]  # stride 1004: rows sit elsewhere in their windows than the output's
    assert step5.window_of(torch.empty(4, 1001), wide)[1] is False
    shifted = torch.empty(4 * 1001 + 1)[1:].view(4, 1001)  # one element past the boundary, unlike the output
    assert step5.window_of(torch.empty(4, 1001), shifted)[1] is False
    same = torch.empty(4 * 1001 + 3)[3:].view(4, 1001)
    assert step5.window_of(same, same) == (3, True, True, 1004)  # both 3 past: the windows shift with them
    assert step5.window_of(torch.empty(2, 3), torch.empty(2, 3))[1] is False  # shorter than a group


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (4, 1001), (2, 2055), (5, 16)], ids=str)
@pytest.mark.parametrize("offset", [1, 3])
def test_output_inside_a_group(step5, dtype, shape, offset):
    """x and the output both `offset` elements past a boundary: the windows shift with them."""
    rows, cols = shape
    gen = torch.Generator().manual_seed(rows * cols + offset)
    x = (torch.randn(rows * cols + offset, generator=gen) * 3).to(dtype)[offset:].view(rows, cols)
    dy = torch.randn(rows * cols + offset, generator=gen).to(dtype)[offset:].view(rows, cols)
    buffer = torch.full((rows * cols + 2 * offset,), float("nan"), dtype=dtype)
    out = buffer[offset:offset + rows * cols].view(rows, cols)
    v = 16 // x.element_size()
    assert step5.window_of(out, x)[:2] == ((offset % v, True) if cols >= v else (0, False))  # 5 bf16: no group
    step5.launch(x, out)
    ref = torch.softmax(x.double(), -1)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert (out.double() - ref).abs().max() < tol
    assert buffer[:offset].isnan().all() and buffer[offset + rows * cols:].isnan().all()  # nothing outside
    y = ref.to(dtype)
    y = torch.cat([torch.zeros(offset, dtype=dtype), y.flatten()])[offset:].view(rows, cols)
    buffer.fill_(float("nan"))
    step5.launch_backward(y, dy, out)
    ref_dx = y.double() * (dy.double() - (y.double() * dy.double()).sum(-1, keepdim=True))
    assert (out.double() - ref_dx).abs().max() < 10 * tol
    assert buffer[:offset].isnan().all() and buffer[offset + rows * cols:].isnan().all()
