"""CUDA attention step 4's key-tile width: 128 keys (3-stage ring) against FA3's 176 (2 stages),
forward, head_dim 128, non-causal, 16k tokens a batch from 512 to 16k keys, beside cuDNN.

attention_04.patch (beside this file) lets the ABL environment variable, read at every call, force
the width: ABL=128 or ABL=176 (unset: the step's own rule, 176 from 8k keys). On a GPU box, from the
repository root:
  git apply bench/ablations/attention_04.patch
  python bench/ablations/attention_04_tile.py
  git apply -R bench/ablations/attention_04.patch
Each width is checked as the bench checks a step (the spec's fp64 reference and tolerance), then the
two widths and the cuDNN tier are timed in turns with the bench's method (CUDA graph replays, L2
flushed, median; timing.measure_in_turns), each on PLACEMENTS outputs of its own in rotation.
"""
from __future__ import annotations

import os

import torch

import rosetta
from rosetta import timing
from rosetta.bench.run.suite import PLACEMENTS
from rosetta.ops import SPECS
from rosetta.ops.attention import SCALE

SEQS = (512, 1000, 2048, 4096, 8192, 16384)


def forced(width: int, launch):
    """The launch with the tile width forced (the patch reads ABL at each call)."""
    def run():
        os.environ["ABL"] = str(width)
        launch()
    return run


def main() -> None:
    forward = SPECS["attention"].forward
    flush = timing.Flush()
    gen = torch.Generator(device="cuda").manual_seed(0)
    step = next(v for v in rosetta.variants(op="attention", backend="cuda") if v.step == 4)
    cudnn_tier = forward.more_tiers["sdpa_cudnn"]
    params = (0, SCALE)
    for seq in SEQS:
        shape = (max(1, 16384 // seq), 16, seq, seq, 128)
        inputs = forward.make_inputs(shape, torch.bfloat16, "cuda", gen)
        ref = forward.reference(*inputs, *params)
        subjects = [[lambda: cudnn_tier(*inputs, None, *params)] * PLACEMENTS]
        line = f"{'x'.join(map(str, shape)):22s}"
        for width in (128, 176):
            outs = [forward.allocate(*inputs) for _ in range(PLACEMENTS)]
            launches = [forced(width, step.launcher("forward", inputs, out, params=params)[0]) for out in outs]
            launches[0]()
            worst = max(err for _, (err, *_rest) in forward.output_errors(outs[0], ref, inputs))
            line += f" {width} error/tol {worst / forward.tolerance[torch.bfloat16]:.2f}"
            subjects.append(launches)
        times = [t["p50_ms"] for t in timing.measure_in_turns(subjects, flush)]
        flop = forward.flops(shape)
        line += "  TFLOP/s: cudnn {:.0f}, 128 keys {:.0f} ({:.3f}x cuDNN), 176 keys {:.0f} ({:.3f}x cuDNN)".format(
            flop / times[0] / 1e9, flop / times[1] / 1e9, times[0] / times[1], flop / times[2] / 1e9, times[0] / times[2])
        print(line, flush=True)


if __name__ == "__main__":
    main()
