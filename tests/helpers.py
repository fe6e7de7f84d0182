"""Checks shared by the CPU and GPU tests: fp64 reference, relative error, a useful message."""

from rosetta.ops import SPECS


def assert_matches_reference(variant, inputs, out):
    """out vs the fp64 reference on the same inputs: relative error under the op's tolerance,
    NaN never passes; on failure, say where the worst element is and by how much."""
    spec = SPECS[variant.op]
    ref = spec.reference(*inputs)
    assert out.shape == ref.shape, f"{variant.label}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    err = spec.relative_error(out, ref, inputs)
    tol = spec.tolerance[inputs[0].dtype]
    if not err <= tol:
        diff = (out.double() - ref).abs().nan_to_num(float("inf"))
        worst = diff.flatten().argmax().item() if diff.numel() else -1
        flat_out, flat_ref = out.flatten(), ref.flatten()
        where = (f"worst element {worst}: got {flat_out[worst].item()}, expected {flat_ref[worst].item()}"
                 if worst >= 0 else "")
        raise AssertionError(f"{variant.label} {inputs[0].dtype} shape {tuple(inputs[0].shape)}: "
                             f"relative error {err:.3g} > {tol:g}; {where}")
