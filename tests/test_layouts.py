"""What the dispatcher hands each step's kernels (CPU: the decisions, not the launches): the layout
rules of ops/spec.py, the copies they cause, and the TMA bound read from strides and addresses."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rosetta
from rosetta.ops.matmul import address, is_column_major, tma_unaligned
from rosetta.ops.spec import fits_layout
from rosetta.torch_ops import kernel_inputs
from rosetta.triton_kernels.tma import check_tma

M, K, N = 24, 16, 32
CASES = {  # name: (tensor, fits rows, fits rows_or_cols)
    "contiguous": (torch.ones(M, K), True, True),
    "column-major (a.t() of a contiguous K x M)": (torch.ones(K, M).t(), False, True),
    "row slice with padded leading dimension": (torch.ones(M, 2 * K)[:, :K], True, True),
    "every other column": (torch.ones(M, 2 * K)[:, ::2], False, False),
    # the gradient of out.sum(): one value broadcast, strides (0, 0); a tensor map cannot read it
    "expanded (strides 0, 0)": (torch.ones(1).expand(M, K), False, False),
    "expanded rows (strides 0, 1)": (torch.ones(K).expand(M, K), True, False),
}


@pytest.mark.parametrize("name", CASES)
def test_layout_rules(name):
    t, rows, rows_or_cols = CASES[name]
    assert fits_layout(t, "any")
    assert fits_layout(t, "rows") == rows
    assert fits_layout(t, "rows_or_cols") == rows_or_cols
    assert fits_layout(t, "contiguous") == t.is_contiguous()


def test_tma_step_gets_a_copy_of_a_broadcast_gradient():
    """matmul's backward runs the forward step on (grad, b.t()); after out.sum().backward() grad
    has strides (0, 0): the TMA steps must receive a contiguous copy, and b.t() as it is."""
    step = next(v for v in rosetta.variants("matmul", "cuda") if v.layout == "rows_or_cols")
    grad = torch.ones(1, dtype=torch.bfloat16).expand(M, N)
    b = torch.ones(K, N, dtype=torch.bfloat16)
    (g, bt), copied = kernel_inputs(step, "forward", (grad, b.t()))
    assert copied == ["a"] and g.is_contiguous()
    assert bt.stride() == (1, N)  # column-major: read in place by a K-major tensor map


def test_tma_bound_judges_a_copied_operand_as_its_copy():
    a = torch.ones(1, dtype=torch.bfloat16).expand(M, K)  # copied to contiguous: 32-byte rows
    assert tma_unaligned(a, torch.ones(K, N, dtype=torch.bfloat16)) == 0
    odd = torch.ones(M, 33, dtype=torch.bfloat16)  # 66-byte rows: no tensor map
    assert tma_unaligned(odd, torch.ones(33, N, dtype=torch.bfloat16)) == 1


def test_addresses_are_read_safely_while_tracing():
    """torch.compile traces the Triton host code with fake tensors, which have no address."""
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(M, K, dtype=torch.bfloat16))
        assert address(fake) == 0
        b = mode.from_tensor(torch.ones(K, N, dtype=torch.bfloat16))
        assert tma_unaligned(fake, b) == 0
        check_tma(6, fake, b, mode.from_tensor(torch.ones(M, N, dtype=torch.bfloat16)))  # no raise


def test_triton_tma_step_reads_transposed_operands_in_place():
    """Triton step 6 describes a column-major operand as the row-major matrix it is in memory, so
    a.t() and b.t() reach the kernel as they are; the output must still be row-major."""
    step = rosetta.registry.select("matmul", "triton", 6)
    assert step.layout == "rows_or_cols"
    a = torch.ones(K, M, dtype=torch.bfloat16).t()
    b = torch.ones(N, K, dtype=torch.bfloat16).t()
    (ka, kb), copied = kernel_inputs(step, "forward", (a, b))
    assert copied == [] and ka.stride() == (1, M) and kb.stride() == (1, K)
    assert is_column_major(ka) and is_column_major(kb)
    check_tma(6, ka, kb, torch.ones(M, N, dtype=torch.bfloat16), columns=True)  # no raise
    with pytest.raises(ValueError, match="out with a 16-byte aligned base, a unit column stride"):
        check_tma(6, ka, kb, torch.ones(N, M, dtype=torch.bfloat16).t(), columns=True)
    with pytest.raises(ValueError, match="a with a 16-byte aligned base, a unit column stride"):
        check_tma(5, ka, kb, torch.ones(M, N, dtype=torch.bfloat16))  # step 5 takes rows only
