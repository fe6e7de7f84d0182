"""Every config of every @triton.autotune kernel, forced alone, against fp64 references.

The autotuner picks a config by timing it, and timings change with whatever else runs on the GPU
(another process, a test shard beside this one), so the config a call gets is not always the one
the bench or test_gpu.py saw win. Each config it may pick has to be correct on every test shape,
not only the winner."""
import pytest
import rosetta
from cases import make_inputs, poisoned_output
from helpers import GPU, assert_matches_reference
from rosetta import torch_ops, triton_launch
from rosetta.dispatch import fits
from rosetta.ops import SPECS
from triton.runtime.autotuner import Autotuner

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # ~55 configs, each compiled for its shapes

# One k-tile per output tile and ~15 tiles per persistent program (132 SMs): the loads of the
# next tiles run far ahead of each tile's epilogue, a regime the spec's small shapes never reach.
EXTRA_SHAPES = {"matmul": [(8192, 16, 8192)]}


def autotuned_configs():
    """(step, kernel name, config index) for every config of every autotuned kernel of a Triton step."""
    cases = []
    for v in rosetta.variants():
        if v.backend != "triton":
            continue
        for name, kernel in vars(torch_ops.triton_module(v)).items():
            if isinstance(kernel, Autotuner):
                cases += [(v, name, i) for i in range(len(kernel.configs))]
    return cases


@pytest.mark.parametrize("v,kernel_name,index", autotuned_configs(),
                         ids=lambda p: getattr(p, "label", str(p)))
def test_every_autotune_config_matches_fp64(gen, monkeypatch, v, kernel_name, index):
    kernel = getattr(torch_ops.triton_module(v), kernel_name)
    # One config: the autotuner runs it without timing anything; an empty cache forgets earlier picks.
    monkeypatch.setattr(kernel, "configs", [kernel.configs[index]])
    monkeypatch.setattr(kernel, "cache", {})
    # and the eager launcher forgets the compiled kernels it keeps per key, which another config chose
    monkeypatch.setattr(triton_launch, "_LAUNCHERS", {})
    spec = SPECS[v.op]
    for shape in [*spec.test_shapes, *EXTRA_SHAPES.get(v.op, [])]:
        for dtype in v.dtypes:
            for direction in spec.directions():
                inputs = make_inputs(v.op, shape, dtype, GPU, gen, direction)
                if fits(v, inputs):
                    # into NaN: a config that leaves a tile unwritten cannot pass on stale memory
                    out = v.launch_into(*inputs, out=poisoned_output(v.op, inputs, direction), direction=direction)
                    assert_matches_reference(v, inputs, out, direction)
