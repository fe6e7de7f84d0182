"""Checks shared by the CPU and GPU tests: the fp64 reference, the elementwise gate, a useful
message that names the step, the shape, the strides and the first element that is wrong; and the
child process that compiles Triton kernels for sm_90 ahead of time (the IR and PTX tests)."""
import json
import os
import subprocess
import sys

import pytest
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


# ---- ahead-of-time compiles for sm_90 (no GPU) ---------------------------------------------------
# A test that reads a Triton kernel's IR runs its own file as a child process without
# TRITON_INTERPRET (under the interpreter, triton's own @jit library functions are interpreter
# objects the compiler cannot use); the child's __main__ prints one JSON line.

def sm90_child(path: str) -> dict:
    """The JSON `path`'s __main__ printed (sm90_main), run without TRITON_INTERPRET; pytest.skip
    where this Triton cannot compile for sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.splitlines()[-1])
    if "skip" in found:
        pytest.skip(found["skip"])
    return found


def sm90_main(compile_all) -> None:
    """A child's __main__: print compile_all()'s dict as JSON, or why it cannot compile here."""
    import triton  # here, not at the top: the tests' own import of this module must not load it early

    try:  # no NVIDIA backend, or no ptxas, in this Triton install
        triton.compiler.make_backend(triton.backends.compiler.GPUTarget("cuda", 90, 32))
        triton.knobs.nvidia.ptxas.path  # noqa: B018
    except Exception as e:
        print(json.dumps({"skip": f"Triton cannot compile for sm_90 here: {e!r}"}))
    else:
        print(json.dumps(compile_all()))
