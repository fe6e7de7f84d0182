"""The Triton norms' backward configs (norm_common.partial_configs) on the GPU's side of `tuned`, the
split grid's plan and layer_norm step 4's posted words: the
interpreter runs one fixed config, so a row length the GPU autotuner has no config for would only
fail on a GPU (it did: rows under 16 columns)."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import rosetta
from rosetta.torch_ops import triton_module
from rosetta.triton_kernels import norm_common
from rosetta.triton_kernels.norm_common import partial_configs

BLOCKS = [2**i for i in range(17)]  # next_power_of_2(cols) for cols 1 .. 65,536


@pytest.mark.parametrize("wide", [False, True], ids=["16-bit", "fp32"])
@pytest.mark.parametrize("max_per_sm", [1, 2, 4])
@pytest.mark.parametrize("block", BLOCKS)
def test_every_row_length_has_configs_that_keep_programs_resident(block, max_per_sm, wide):
    found = partial_configs(block, max_per_sm, wide)
    assert found, f"no backward config for rows of {block} columns"
    for rows, chunk, warps, per_sm in found:
        assert per_sm <= max_per_sm and 8 <= per_sm * warps <= 16
        assert 1 <= rows <= 64
        # whole rows up to 8,192 columns; from 8,192 a row may stream in chunks, past it it must
        whole, chunked = chunk == block and block <= 8192, chunk < block and block >= 8192 and rows == 1
        assert whole or chunked, (rows, chunk, warps, per_sm)


@pytest.mark.parametrize("element_size", [2, 4], ids=["16-bit", "fp32"])
@pytest.mark.parametrize("cols", [4096, 4097, 5000, 8192, 8193, 16384, 32768, 50000, 65536])
def test_split_plan_keeps_every_program_of_a_row_resident(monkeypatch, cols, element_size):
    """Step 4's grid on a 132-SM GPU: whole slices cover the row, each program holds 8-16 values a
    thread and tensor, every program of the grid fits at once (16 warps an SM), and a row past
    16 KB is split. A group left waiting for a program that cannot start would spin forever."""
    monkeypatch.setattr(norm_common, "INTERPRET", False)
    monkeypatch.setattr(norm_common, "sm_count", lambda device: 132)
    width, warps, per_sm, slices, groups = norm_common.split_plan(None, 10_000, cols, element_size)
    assert (slices - 1) * width < cols <= slices * width
    assert warps * per_sm == norm_common.SPLIT_WARPS_PER_SM and width // (32 * warps) in (8, 16)
    assert 1 <= groups and groups * slices <= 132 * per_sm
    assert (slices > 1) == (cols * element_size > norm_common.SPLIT_ROW_BYTES)


share_pair = triton_module(next(v for v in rosetta.variants(op="layer_norm", backend="triton") if v.step == 4)).share_pair


@triton.jit
def _post_pair(part_ptr, a_ptr, b_ptr, out_a_ptr, out_b_ptr, s, slices, SLICES_P2: tl.constexpr):
    a, b = share_pair(part_ptr, 0, s, slices, tl.load(a_ptr + s), tl.load(b_ptr + s), SLICES_P2)
    k = tl.arange(0, SLICES_P2)
    tl.store(out_a_ptr + k, a)
    tl.store(out_b_ptr + k, b)


def _pair_words(a, b):
    """share_pair's words as the host computes them: a's bits high, b's bits low with the last set."""
    hi = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64) << np.uint64(32)
    lo = np.asarray(b, np.float32).view(np.uint32).astype(np.uint64) | np.uint64(1)
    return (hi | lo).view(np.int64)


def test_layer_norm_split_rows_posts_both_partials_in_one_word():
    """layer_norm step 4's share_pair: a slice's two partials travel as one 64-bit word that is
    never zero, and come back per slice, in slice order, b within one unit in its last place. The
    peers' words are posted here by the host (programs under the interpreter run one at a time)."""
    a = torch.tensor([0.0, -0.0, 1.5e-30, -3.25, 7.0], dtype=torch.float32)
    b = torch.tensor([0.0, -0.0, -2.5, 1e30, float("inf")], dtype=torch.float32)
    slices, mine = 5, 3
    words = torch.from_numpy(_pair_words(a.numpy(), b.numpy()))
    assert (words != 0).all()
    words[mine] = 0  # this program's slot: not posted yet
    out_a, out_b = torch.full((8,), float("nan")), torch.full((8,), float("nan"))
    _post_pair[(1,)](words, a, b, out_a, out_b, mine, slices, SLICES_P2=8)
    assert words[mine] == _pair_words(a[mine:mine + 1].numpy(), b[mine:mine + 1].numpy())[0]
    assert torch.equal(out_a[:slices].view(torch.int32), a.view(torch.int32))
    assert torch.equal(out_b[:slices].view(torch.int32), b.view(torch.int32) | 1)
    assert (out_a[slices:] == 0).all() and (out_b[slices:] == 0).all()
