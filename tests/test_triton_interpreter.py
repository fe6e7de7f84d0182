"""Every Triton step under TRITON_INTERPRET=1 on CPU tensors, against fp64, for each direction
(fp32/fp16 only: the interpreter computes bf16 wrongly)."""
import pytest
import torch

import rosetta
from cases import make_inputs, poisoned_output, strided_cases
from helpers import assert_matches_reference
from rosetta.dispatch import fits
from rosetta.ops import SPECS

TRITON = rosetta.variants(backend="triton")
CPU_DTYPES = (torch.float32, torch.float16)
CASES = [(v, d, direction) for v in TRITON for d in CPU_DTYPES if d in v.dtypes
         for direction in SPECS[v.op].directions()]



@pytest.mark.parametrize("v,dtype,direction", CASES, ids=lambda p: getattr(p, "label", str(p)))
def test_triton_step_on_cpu(interpreter, cpu_gen, v, dtype, direction):
    for shape in SPECS[v.op].cpu_shapes:
        inputs = make_inputs(v.op, shape, dtype, "cpu", cpu_gen, direction)
        if not fits(v, inputs):  # a declared limit: refused before launch, naming the steps that take it
            with pytest.raises(ValueError, match="steps"):
                v(*inputs) if direction == "forward" else v.backward(*inputs)
            continue
        out = v(*inputs) if direction == "forward" else v.backward(*inputs)
        assert_matches_reference(v, inputs, out, direction)


@pytest.mark.parametrize("v", TRITON, ids=lambda v: v.label)
def test_triton_step_strided(interpreter, cpu_gen, v):
    dtype = torch.float32 if torch.float32 in v.dtypes else torch.float16
    for name, inputs in strided_cases(v.op, dtype, "cpu", cpu_gen):
        if not fits(v, inputs):
            with pytest.raises(ValueError, match="steps"):
                v(*inputs)
            continue
        assert_matches_reference(v, inputs, v(*inputs))


@pytest.mark.parametrize("v", TRITON, ids=lambda v: v.label)
def test_triton_launch_into_poisoned_output(interpreter, cpu_gen, v):
    """The bench's path: a preallocated output poisoned with NaN must be fully overwritten."""
    dtype = torch.float32 if torch.float32 in v.dtypes else torch.float16
    # matmul: rows TMA can read, M <= 16 (M = 1 for the one-row GEMV); else the last non-empty CPU
    # shape the step takes
    shapes = [(8, 16, 8), (1, 16, 8)] if v.op == "matmul" else \
        [s for s in reversed(SPECS[v.op].cpu_shapes) if 0 not in s]
    inputs = next(i for i in (make_inputs(v.op, s, dtype, "cpu", cpu_gen) for s in shapes) if fits(v, i))
    out = poisoned_output(v.op, inputs)
    assert_matches_reference(v, inputs, v.launch_into(*inputs, out=out))


# ---- softmax: a declared limit, refused before any launch -------------------------------------
SOFTMAX_BOUNDED = [v for v in rosetta.variants("softmax", "triton") if v.bounds]


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("v", SOFTMAX_BOUNDED, ids=lambda v: v.label)
def test_softmax_declared_limit_refused_before_launch(interpreter, cpu_gen, v, direction):
    """A row one past the step's `Max:` (Triton step 1: cols <= 32768) is refused by the input
    checks, before the kernel is launched, so the CPU sees the same error as a GPU: the limit, the
    value, and exactly the steps of the ladder that take the row."""
    (quantity, limit), = v.bounds
    inputs = make_inputs(v.op, (2, limit + 1), torch.float32, "cpu", cpu_gen, direction)
    takers = [s.step for s in rosetta.variants(v.op, v.backend)
              if not any(q == quantity and limit + 1 > m for q, m in s.bounds)]
    assert v.step not in takers and takers
    with pytest.raises(ValueError, match=rf"^{v.label} takes {quantity} <= {limit}, got {quantity} = {limit + 1}"
                                         rf".*; {v.op}/{v.backend} steps {', '.join(map(str, takers))} take it$"):
        v(*inputs) if direction == "forward" else v.backward(*inputs)


# ---- matmul step 7: the split-K reduction ------------------------------------------------------
SPLIT_K = next(v for v in rosetta.variants("matmul", "triton") if v.name == "split_k")


@pytest.mark.parametrize("slices", [1, 2, 3, 4, 5, 6])
def test_split_k_reduction_takes_every_slice(interpreter, cpu_gen, slices):
    """The reduction loads four slices at a time: counts that are not a multiple of four leave
    masked loads at the end of its loop, and every slice must still be added once."""
    a, b = make_inputs("matmul", (5, 100, 24), torch.float32, "cpu", cpu_gen)  # 7 K-steps of 16
    out = torch.full((5, 24), float("nan"))
    rosetta.torch_ops.raw_launcher(SPLIT_K, "forward")(a, b, out, split_k=slices)
    assert_matches_reference(SPLIT_K, (a, b), out)


FIXUP = next(v for v in rosetta.variants("matmul", "triton") if v.name == "split_k_fixup")


@pytest.mark.parametrize("slices", [1, 2, 3, 5])
def test_split_k_fixup_adds_as_the_reduction_does(interpreter, cpu_gen, slices):
    """Step 9's last slice adds the partials in step 7's order: the same bits, and every counter it
    drew back at zero for the next launch (nobody else zeroes them)."""
    from rosetta.triton_launch import _TICKETS

    a, b = make_inputs("matmul", (5, 100, 24), torch.float32, "cpu", cpu_gen)  # 7 K-steps of 16
    two_kernels, fixed_up = torch.full((5, 24), float("nan")), torch.full((5, 24), float("nan"))
    rosetta.torch_ops.raw_launcher(SPLIT_K, "forward")(a, b, two_kernels, split_k=slices)
    for _ in range(2):  # the second launch finds the counters the first one left
        rosetta.torch_ops.raw_launcher(FIXUP, "forward")(a, b, fixed_up, split_k=slices)
        assert torch.equal(fixed_up, two_kernels)
        assert not any(t.any() for t in _TICKETS.values())
    assert_matches_reference(FIXUP, (a, b), fixed_up)


def test_split_k_reduction_grid_fills_the_machine():
    """reduce_tile: 1,024 outputs a program for large outputs, fewer (not under 128) until the
    grid has two programs an SM; rows a program min(8, M) so that M = 1 wastes no lanes."""
    reduce_tile = rosetta.torch_ops.triton_module(SPLIT_K).reduce_tile
    assert reduce_tile(128, 4096, 132) == (8, 128)  # 512 programs of 1,024 outputs
    assert reduce_tile(64, 64, 132) == (8, 16)  # 4,096 outputs: 32 programs of the least, 128
    assert reduce_tile(1, 3072, 132) == (1, 128)
    for m, n in [(1, 1), (3, 7), (16, 4096), (300, 300), (128, 28672)]:
        rows, cols = reduce_tile(m, n, 132)
        assert rows == min(8, 1 << (m - 1).bit_length()) and 128 <= rows * cols <= 1024
        programs = -(-m // rows) * -(-n // cols)
        assert rows * cols == 128 or programs >= 2 * 132


LAST_WAVE = next(v for v in rosetta.variants("matmul", "triton") if v.name == "split_last_wave")


@pytest.mark.parametrize("shape,whole,slices", [((64, 160, 64), 3, 2), ((20, 200, 24), 0, 3), ((96, 64, 96), 9, 1)],
                         ids=["a tail of one tile", "under one wave", "no tail"])
def test_split_last_wave_splits_only_the_tail(interpreter, cpu_gen, shape, whole, slices):
    """Step 10 on the interpreter's 3 "SMs" and its one 32 x 32 x 16 config: the full waves' tiles
    whole, the tail's tiles in K-slices added in the kernel; two launches give the same bits, and
    every counter the last slice drew is back at zero (nobody else zeroes them)."""
    from rosetta.triton_launch import _TICKETS

    module = rosetta.torch_ops.triton_module(LAST_WAVE)
    (c,) = module.CONFIGS
    M, K, N = shape
    tiles = -(-M // c.kwargs["BLOCK_M"]) * -(-N // c.kwargs["BLOCK_N"])
    assert module.split_plan(tiles, -(-K // c.kwargs["BLOCK_K"]), module.INTERPRET_SMS) == (whole, slices)
    a, b = make_inputs("matmul", shape, torch.float16, "cpu", cpu_gen)
    first, second = torch.full((M, N), float("nan"), dtype=a.dtype), torch.full((M, N), float("nan"), dtype=a.dtype)
    for out in (first, second):
        rosetta.torch_ops.raw_launcher(LAST_WAVE, "forward")(a, b, out)
        assert not any(t.any() for t in _TICKETS.values())
    assert torch.equal(first, second)
    assert_matches_reference(LAST_WAVE, (a, b), first)


GEMV_TILES = next(v for v in rosetta.variants("matmul", "triton") if v.name == "gemv_tiles")


@pytest.mark.parametrize("shape", [(1, 100, 150), (1, 7, 64), (1, 0, 40)],
                         ids=["3 slices, a ragged last strip", "short K, one strip", "K = 0"])
def test_gemv_tiles_fix_up_leaves_its_counters_at_zero(interpreter, cpu_gen, shape):
    """Step 11 under the interpreter splits K three ways wherever K allows: the last slice of each
    strip adds the partials in order (two launches, the same bits) and leaves its counter at zero
    for the next launch (nobody else zeroes them)."""
    from rosetta.triton_launch import _TICKETS

    M, K, N = shape
    a, b = make_inputs("matmul", shape, torch.float32, "cpu", cpu_gen)
    first, second = torch.full((M, N), float("nan")), torch.full((M, N), float("nan"))
    for out in (first, second):
        rosetta.torch_ops.raw_launcher(GEMV_TILES, "forward")(a, b, out)
        assert not any(t.any() for t in _TICKETS.values())
    assert torch.equal(first, second)
    assert_matches_reference(GEMV_TILES, (a, b), first)


def test_gemv_tiles_split_aims_at_four_programs_an_sm(monkeypatch):
    """On a GPU (132 SMs): slices of whole 64-row tiles, ~4 programs an SM, at most 64 slices."""
    module = rosetta.torch_ops.triton_module(GEMV_TILES)
    monkeypatch.setattr(module, "INTERPRET", False)
    assert module.split_rows(32, 4096, 132) == 256  # 1 x 4096 x 4096 bf16: 32 strips x 16 slices
    assert module.split_rows(24, 768, 132) == 64  # 1 x 768 x 3072: 12 slices, one tile each
    assert module.split_rows(112, 4096, 132) == 1024  # 1 x 4096 x 14336: 112 strips x 4
    assert module.split_rows(600, 4096, 132) == 4096  # more strips than 4 an SM: no split
    assert module.split_rows(1, 1 << 20, 132) == (1 << 20) // 64  # one strip: at most 64 slices
    assert module.split_rows(32, 0, 132) == 64  # K = 0: one (empty) slice
