"""The norms' step 3 forward: is its persistent grid what costs layer_norm against rms_norm's step 2?

rms_norm's step 2 (one block per row group, a grid-stride loop) beats its own step 3 (persistent
blocks, the next row loaded before this one is reduced) on the large bf16 forwards, and layer_norm's
step 3 sat 3-6% under both. norm_03_grid.patch (beside this file) adds a switch to both steps 3's
forward launch (norm::launch_forward_rows), read on every call from the NORM_GRID environment
variable; set, the kernel with a row ahead runs whatever the rows (the step as it was when this
ablation was made, before it took a kernel without one on many waves of rows: norm_03_lean.py):

  1       the persistent grid (as many blocks as are resident at once)
  0       one block per row group: not persistent (the kernel's row loop runs once)
  2       twice the resident blocks: persistent, but the scheduler can start a block while
          another waits at its barrier

On a GPU box, from the repository root:
  git apply bench/ablations/norm_03_grid.patch
  python bench/ablations/norm_03_grid.py
  git apply -R bench/ablations/norm_03_grid.patch
Each subject is checked against fp64 (F.layer_norm / F.rms_norm in float64), then all are timed in
turns with the bench's method (CUDA graph replays, L2 flushed, median; timing.measure_in_turns). The
switch is read at graph capture, so each subject's graph keeps its own grid. GB/s counts 2 |x|.
"""
import os

import torch
import torch.nn.functional as F
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

import rosetta
from rosetta.timing import Flush, measure_in_turns

SHAPES = [(4096, 4096, torch.bfloat16), (16384, 8192, torch.bfloat16), (32768, 4096, torch.bfloat16),
          (4096, 32768, torch.bfloat16), (4096, 4096, torch.float32), (4096, 1024, torch.bfloat16),
          (65536, 1024, torch.bfloat16)]


def with_env(env, fn):
    """fn with the environment variables in `env` set while it runs."""
    def call():
        os.environ.update(env)
        try:
            return fn()
        finally:
            for k in env:
                os.environ.pop(k, None)
    return call


def with_grid(value, fn):
    """fn with NORM_GRID set to `value` while it runs."""
    return with_env({"NORM_GRID": value}, fn)


def time_subjects(label, subjects, dt, ln_ref, rms_ref, gb, flush):
    """Each subject checked against its fp64 reference (rms_* against rms_ref), then the correct
    ones timed in turns; prints one line of GB/s (gb / median time)."""
    names, calls = [], []
    for name, fn in subjects.items():
        try:
            y = fn()
        except Exception as exc:  # a step's declared range (step 2: cols <= 8192), refused
            print("  ERR", name, type(exc).__name__, str(exc)[:200])
            continue
        y = y[0] if isinstance(y, tuple) else y
        err = (y.double() - (rms_ref if name.startswith("rms") else ln_ref)).abs().max().item()
        if not err < (0.8 if dt != torch.float32 else 0.008):
            print(f"  WRONG {name}: max error {err:.3g}")
            continue
        names.append(name)
        calls.append([fn])
    res = measure_in_turns(calls, flush)
    print(f"{label}: " + "  ".join(f"{n} {gb / (r['p50_ms'] / 1e3):.0f}" for n, r in zip(names, res)), flush=True)


def forwards(shapes, step_3_subjects):
    """For each (rows, cols, dtype): torch.compile, Liger, CUDA step 2 and Triton steps 1 and 3,
    beside `step_3_subjects(ln, rms)` (name -> call; ln(step) / rms(step) make a CUDA step's call),
    checked and timed by time_subjects."""
    flush = Flush("read")
    compiled = torch.compile(F.layer_norm)
    for rows, cols, dt in shapes:
        x, w, b = (torch.randn(*s, device="cuda", dtype=dt) for s in ((rows, cols), (cols,), (cols,)))
        ln_ref = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
        rms_ref = F.rms_norm(x.double(), (cols,), w.double(), 1e-5)
        ln = lambda step: lambda: rosetta.layer_norm(x, w, b, backend="cuda", step=step)  # noqa: E731
        rms = lambda step: lambda: rosetta.rms_norm(x, w, backend="cuda", step=step)  # noqa: E731
        subjects = {"compile": lambda: compiled(x, (cols,), w, b, 1e-5),
                    "liger": lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5),
                    "ln_c2": ln(2),
                    "ln_t1": lambda: rosetta.layer_norm(x, w, b, backend="triton", step=1),
                    "ln_t3": lambda: rosetta.layer_norm(x, w, b, backend="triton", step=3),
                    "rms_c2": rms(2), "rms_liger": lambda: LigerRMSNormFunction.apply(x, w, 1e-5),
                    **step_3_subjects(ln, rms)}
        time_subjects(f"{rows}x{cols} {str(dt)[6:]}", subjects, dt, ln_ref, rms_ref,
                      2 * x.numel() * x.element_size() / 1e9, flush)


def main():
    forwards(SHAPES, lambda ln, rms: {
        "ln_c3": with_grid("1", ln(3)), "ln_c3_all": with_grid("0", ln(3)), "ln_c3_x2": with_grid("2", ln(3)),
        "rms_c3": with_grid("1", rms(3)), "rms_c3_all": with_grid("0", rms(3))})


if __name__ == "__main__":
    main()
