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
Tiles with no kernel without a row ahead (warp tiles, clusters of 2 and 8) run the committed step;
a cluster of 4's is the 1,024-thread block a row (step 3's (6)).

On a GPU box, from the repository root:
  git apply bench/ablations/norm_03_lean.patch
  python bench/ablations/norm_03_lean.py
  git apply -R bench/ablations/norm_03_lean.patch
Each subject is checked against fp64 (F.layer_norm / F.rms_norm in float64), then all are timed in
turns with the bench's method (CUDA graph replays, L2 flushed, median; timing.measure_in_turns). The
switches are read at graph capture, so each subject's graph keeps its own kernel. GB/s counts 2 |x|.
"""
import torch

from norm_03_grid import forwards, with_env  # beside this file

SHAPES = [(4096, 4096, torch.bfloat16), (16384, 8192, torch.bfloat16), (32768, 4096, torch.bfloat16),
          (4096, 8192, torch.bfloat16), (8192, 2048, torch.bfloat16), (4096, 6000, torch.bfloat16),
          (16384, 8192, torch.float16), (4096, 4096, torch.float32)]


def main():
    forwards(SHAPES, lambda ln, rms: {
        "ln_c3": with_env({"NORM_FWD": "ahead"}, ln(3)),
        "ln_c3_lean": with_env({"NORM_FWD": "alone_persistent"}, ln(3)),
        "ln_c3_lean_all": with_env({"NORM_FWD": "alone"}, ln(3)), "ln_c3_now": ln(3),
        "rms_c3": with_env({"NORM_FWD": "ahead"}, rms(3))})


if __name__ == "__main__":
    main()
