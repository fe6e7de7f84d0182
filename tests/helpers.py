"""Checks shared by the CPU and GPU tests: the fp64 reference, the elementwise gate, a useful
message that names the step, the shape, the strides and the first element that is wrong."""
import os

import torch

from rosetta.ops import SPECS
from rosetta.ops.spec import as_tuple


# Where the GPU tests put their tensors. ROSETTA_TEST_DEVICE=cuda:1 on a two-GPU machine puts every
# input on the second GPU while the current device stays cuda:0: a launch that forgets the
# tensors' device then fails.
GPU = torch.device(os.environ.get("ROSETTA_TEST_DEVICE", "cuda"))


def assert_matches_reference(variant, inputs, out, direction="forward"):
    """out vs the fp64 reference on the same inputs, output by output: the worst elementwise error
    under the op's tolerance (NaN never passes); on failure, say which output, where and by how
    much."""
    d = SPECS[variant.op].directions()[direction]
    ref = d.reference(*inputs)
    outs, refs, expected_outs = as_tuple(out), as_tuple(ref), as_tuple(d.allocate(*inputs))
    assert len(outs) == len(d.outputs), f"{variant.label}: {len(outs)} outputs, expected {d.outputs}"
    tol = d.tolerance[inputs[0].dtype]
    for (name, (err, worst, got, expected)), o, r, e in zip(d.output_errors(out, ref, inputs), outs, refs, expected_outs):
        assert o.shape == r.shape, f"{variant.label} {name}: shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        assert o.dtype == e.dtype, f"{variant.label} {name}: dtype {o.dtype}, expected {e.dtype}"
        if not err <= tol:
            where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), r.shape)) if r.dim() else ()
            raise AssertionError(
                f"{variant.label} {direction} {inputs[0].dtype} shapes {[tuple(t.shape) for t in inputs]} "
                f"strides {[t.stride() for t in inputs]}: {name}'s error {err:.3g} > {tol:g}; worst element "
                f"{where}: got {got}, expected {expected}")


def gpu_memory_allows(nbytes: int) -> bool:
    free, _ = torch.cuda.mem_get_info(GPU)
    return free > nbytes
