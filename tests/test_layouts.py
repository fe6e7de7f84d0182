"""What the dispatcher hands each step's kernels (CPU: the decisions, not the launches): the layout
rules of ops/spec.py, the copies they cause, and the TMA bound read from strides and addresses."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rosetta
from rosetta.ops.matmul import address, autograd_grads, is_column_major, tma_out_unaligned, tma_unaligned
from rosetta.ops.spec import fits_layout, layout_copy
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
    # tma_rows: tma's alignment, rows only (every case here is 16-byte aligned where it is a matrix)
    assert fits_layout(t, "tma_rows") == (fits_layout(t, "tma") and t.stride(-1) == 1)


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


@pytest.mark.parametrize("layout", ["rows", "rows_or_cols"])
def test_a_layout_copy_starts_every_row_on_16_bytes(layout):
    """An input that breaks a row layout is copied into rows padded to 16 bytes, so a TMA step or
    a 128-bit load path can still take the copy (a plain .contiguous() of 33 bf16 columns could not)."""
    t = torch.randn(5, 66, dtype=torch.bfloat16)[:, ::2]
    copy = layout_copy(t, layout)
    assert torch.equal(copy, t) and copy.stride() == (40, 1) and fits_layout(copy, layout)
    assert tma_unaligned(copy) == 0 and tma_unaligned(t.contiguous()) == 1
    assert layout_copy(t, "contiguous").is_contiguous()  # other layouts get a plain copy


def test_default_step_is_the_last_one_whose_limits_the_inputs_fit():
    """With no measured table (the CPU), step=None picks the most optimized step that takes the
    inputs, `Slower:` steps aside: a tiny problem goes to the last step (a small-problem one: today
    a split-K in both backends, CUDA's inside a cluster, Triton's with the fix-up in the kernel; a
    GEMV would take only its own M); 16 rows go to a split-K step; a large problem is past every
    split-K step's declared range (output_tiles) and goes to the last TMA step; a K of 33 (66-byte
    rows, no tensor map) goes past every TMA step to the last one without that limit."""
    def best(m, k, n):
        return rosetta.best("matmul", backend, torch.bfloat16,
                            (torch.ones(m, k, dtype=torch.bfloat16), torch.ones(k, n, dtype=torch.bfloat16)))
    for backend in rosetta.BACKENDS:
        last = rosetta.best("matmul", backend, torch.bfloat16)
        bounds = dict(last.bounds)
        assert "m_rows" in bounds or bounds.get("output_tiles") == 264, \
            "the last 16-bit step is a small-problem one: a GEMV (M <= its m_rows) or a split-K"
        assert best(min(4, bounds.get("m_rows", 4)), 32, 64) is last
        split_k = best(16, 32, 64)
        assert dict(split_k.bounds)["output_tiles"] == 264
        # past the GEMV's rows an earlier split-K step; where the last step is a split-K, that one
        assert split_k.step < last.step if "m_rows" in bounds else split_k is last
        big = best(2048, 32, 4096)  # 16 x 32 tiles of 128 x 128: past split-K's range
        assert "tma_unaligned" in dict(big.bounds) and "output_tiles" not in dict(big.bounds)
        odd_k = best(2048, 33, 4096)
        assert not odd_k.bounds and odd_k.step < big.step
    # malformed inputs still reach the last step, whose checks say what is wrong
    a = torch.ones(16, 33, dtype=torch.bfloat16)
    assert rosetta.best("matmul", "triton", torch.bfloat16, (a, a)) is rosetta.best("matmul", "triton", torch.bfloat16)


def test_tma_store_bound_counts_the_gradient_rows_only_when_one_is_needed():
    """Triton's TMA steps store out (M x N) and, in the backward, dA (M x K) through tensor maps."""
    a, b = torch.ones(16, 36, dtype=torch.bfloat16), torch.ones(36, 64, dtype=torch.bfloat16)
    assert tma_out_unaligned(a, b) == 0  # K = 36 (72-byte rows) only matters for dA
    assert tma_out_unaligned(a.requires_grad_(), b) == 1
    assert tma_out_unaligned(a, torch.ones(36, 63, dtype=torch.bfloat16)) == 2


def test_backward_hands_the_step_a_gradient_it_can_read():
    """A column-major b with an odd N passes the forward (b's other stride is K), but dC is then
    M x N contiguous with 126-byte rows: the backward gives the step a copy in aligned rows."""
    a = torch.ones(M, K, dtype=torch.bfloat16)
    b = torch.ones(63, K, dtype=torch.bfloat16).t()
    assert tma_unaligned(a, b) == 0
    seen = []
    step_ops = type("StepOps", (), {"forward": staticmethod(lambda x, y: seen.append(x) or x @ y)})
    ctx = type("Ctx", (), {"saved_tensors": (a, b), "needs_input_grad": (True, True)})
    da, db = autograd_grads(step_ops, ctx, torch.ones(M, 63, dtype=torch.bfloat16))
    assert all(tma_unaligned(x) == 0 for x in seen[::2]) and seen[0].stride() == (64, 1)
    assert da.shape == a.shape and db.shape == b.shape


def test_a_triton_tma_step_refuses_an_output_it_cannot_store(monkeypatch):
    """Checked before any launch (so on the CPU, where the interpreter runs Triton steps): b is
    column-major, which TMA reads, but N = 63 gives out 126-byte rows; the message names the
    steps that take the input."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    a, b = torch.ones(16, 32, dtype=torch.bfloat16), torch.ones(63, 32, dtype=torch.bfloat16).t()
    for step in (5, 6):
        with pytest.raises(ValueError, match=r"tma_out_unaligned <= 0, got tma_out_unaligned = 1.*"
                                             r"matmul/triton steps 1, 2, 3, 4, 7, 9 take it"):
            rosetta.registry.select("matmul", "triton", step)(a, b)
    assert rosetta.matmul(a, b).shape == (16, 63)  # step=None: step 9 (split-K, no TMA)
