"""layer_norm's CUDA step 3 forward: a row in flight ahead (2 CTAs an SM at 64 registers) or none (3 at 40)?

layer_norm's step 3 loaded the next row, still packed, before the current one was reduced; its
16-bit 512 x 16 and 256 x 16 tiles then take 64 registers (ptxas, sm_90): 2 CTAs of 512 (4 of 256)
an SM, two rows each. rms_norm's step 2 runs the same tiles with no row ahead at 40 registers:
3 CTAs of 512 (6 of 256), one row each, and was 3-6% faster on the large bf16 forwards. Both
steps 3 now also have a kernel without the row ahead (16-bit tiles bound to 40 registers) and
take it, a block per row group, where the rows make 12 or more waves (norm::launch_forward_rows).
norm_03_lean.patch (beside this file) adds a switch there, read on every call:

  NORM_FWD unset             the step as committed (the rule above)
  NORM_FWD=ahead             the kernel with the row ahead, persistent grid, whatever the rows
                             (the step before the rule)
  NORM_FWD=alone             the kernel without, one block per row group, whatever the rows
  NORM_FWD=alone_persistent  the kernel without, in the persistent grid
Tiles with no kernel without a row ahead (warp tiles, clusters) run the committed step.

On a GPU box, from the repository root:
  git apply bench/ablations/norm_03_lean.patch
  python bench/ablations/norm_03_lean.py
  git apply -R bench/ablations/norm_03_lean.patch
Each subject is checked against fp64 (F.layer_norm / F.rms_norm in float64), then all are timed in
turns with the bench's method (CUDA graph replays, L2 flushed, median; timing.measure_in_turns). The
switches are read at graph capture, so each subject's graph keeps its own kernel. GB/s counts 2 |x|.
"""
import torch
import torch.nn.functional as F
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

import rosetta
from rosetta.timing import Flush

from norm_03_grid import time_subjects, with_env  # beside this file

SHAPES = [(4096, 4096, torch.bfloat16), (16384, 8192, torch.bfloat16), (32768, 4096, torch.bfloat16),
          (4096, 8192, torch.bfloat16), (8192, 2048, torch.bfloat16), (4096, 6000, torch.bfloat16),
          (16384, 8192, torch.float16), (4096, 4096, torch.float32)]


def main():
    flush = Flush("read")
    compiled = torch.compile(F.layer_norm)
    for rows, cols, dt in SHAPES:
        x, w, b = (torch.randn(*s, device="cuda", dtype=dt) for s in ((rows, cols), (cols,), (cols,)))
        ln_ref = F.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
        rms_ref = F.rms_norm(x.double(), (cols,), w.double(), 1e-5)
        ln = lambda step: lambda: rosetta.layer_norm(x, w, b, backend="cuda", step=step)  # noqa: E731
        rms = lambda step: lambda: rosetta.rms_norm(x, w, backend="cuda", step=step)  # noqa: E731
        subjects = {"compile": lambda: compiled(x, (cols,), w, b, 1e-5),
                    "liger": lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5),
                    "ln_c2": ln(2), "ln_c3": with_env({"NORM_FWD": "ahead"}, ln(3)),
                    "ln_c3_lean": with_env({"NORM_FWD": "alone_persistent"}, ln(3)),
                    "ln_c3_lean_all": with_env({"NORM_FWD": "alone"}, ln(3)), "ln_c3_now": ln(3),
                    "ln_t1": lambda: rosetta.layer_norm(x, w, b, backend="triton", step=1),
                    "ln_t3": lambda: rosetta.layer_norm(x, w, b, backend="triton", step=3),
                    "rms_c2": rms(2), "rms_c3": with_env({"NORM_FWD": "ahead"}, rms(3)),
                    "rms_liger": lambda: LigerRMSNormFunction.apply(x, w, 1e-5)}
        time_subjects(f"{rows}x{cols} {str(dt)[6:]}", subjects, dt, ln_ref, rms_ref,
                      2 * x.numel() * x.element_size() / 1e9, flush)


if __name__ == "__main__":
    main()
