"""The Triton norms' backward configs (norm_common.partial_configs) on the GPU's side of `tuned`: the
interpreter runs one fixed config, so a row length the GPU autotuner has no config for would only
fail on a GPU (it did: rows under 16 columns)."""
import pytest

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
