"""Checks shared by the CPU and GPU tests: the fp64 reference, the elementwise gate, a useful
message that names the step, the shape, the strides and the first element that is wrong."""
import os

import torch

from rosetta.ops import SPECS


# Where the GPU tests put their tensors. ROSETTA_TEST_DEVICE=cuda:1 on a two-GPU machine puts every
# input on the second GPU while the current device stays cuda:0: a launch that forgets the
# tensors' device then fails.
GPU = torch.device(os.environ.get("ROSETTA_TEST_DEVICE", "cuda"))


def assert_matches_reference(variant, inputs, out, direction="forward"):
    """out vs the fp64 reference on the same inputs: the worst elementwise error under the op's
    tolerance (NaN never passes); on failure, say where and by how much."""
    d = SPECS[variant.op].directions()[direction]
    ref = d.reference(*inputs)
    assert out.shape == ref.shape, f"{variant.label}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    assert out.dtype == d.allocate(*inputs).dtype, f"{variant.label}: dtype {out.dtype}"
    err, worst, got, expected = d.error_report(out, ref, inputs)
    tol = d.tolerance[inputs[0].dtype]
    if not err <= tol:
        where = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), ref.shape)) if ref.dim() else ()
        raise AssertionError(
            f"{variant.label} {direction} {inputs[0].dtype} shapes {[tuple(t.shape) for t in inputs]} "
            f"strides {[t.stride() for t in inputs]}: error {err:.3g} > {tol:g}; worst element {where}: "
            f"got {got}, expected {expected}")


def gpu_memory_allows(nbytes: int) -> bool:
    free, _ = torch.cuda.mem_get_info(GPU)
    return free > nbytes
