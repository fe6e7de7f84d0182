"""The Triton norms' backward configs (norm_common.partial_configs) on the GPU's side of `tuned`: the
interpreter runs one fixed config, so a row length the GPU autotuner has no config for would only
fail on a GPU (it did: rows under 16 columns)."""
import pytest

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
