"""Peer libraries as bench tiers, when they import: Liger-Kernel's Triton softmax, RMSNorm and
LayerNorm (forward and backward). A peer that is not installed, or that refuses a shape, is named
in the table as such."""
from __future__ import annotations

import importlib

LIGER_MAX_COLS = 65536  # liger_kernel.ops.utils.calculate_settings: MAX_FUSED_SIZE


def available(peer: str) -> bool:
    try:
        importlib.import_module({"liger": "liger_kernel.ops.softmax"}[peer])
        return True
    except Exception:  # absent, or its import fails on this machine
        return False


LIGER_OPS = ("softmax", "rms_norm", "layer_norm")


def takes(peer: str, op: str, direction: str) -> bool:
    return peer == "liger" and op in LIGER_OPS


def runner(peer: str, op: str, direction: str, inputs: tuple):
    """A zero-argument call of the peer's kernels on `inputs` (it allocates its own output).
    Raises ValueError for a peer that is absent or refuses the shape: the bench reports it."""
    if not available(peer):
        raise ValueError(f"{peer} is not installed (pip install liger-kernel)")
    if op != "softmax":
        return norm_runner(op, direction, inputs)
    from liger_kernel.ops import softmax as liger

    x = inputs[0]
    if x.shape[-1] > LIGER_MAX_COLS:
        raise ValueError(f"Liger refuses rows longer than {LIGER_MAX_COLS:,} (got {x.shape[-1]:,})")
    if direction == "forward":
        return lambda: liger._softmax_forward(x)[0]
    from liger_kernel.ops.utils import calculate_settings

    y, dy = inputs
    block, warps = calculate_settings(y.shape[-1])  # what its forward would have chosen
    return lambda: liger._softmax_backward(dy, y, block, warps, False)


def norm_runner(op: str, direction: str, inputs: tuple):
    """Liger's RMSNorm (llama casting: fp32 rstd, as ours) and LayerNorm, their statistics shaped
    as ours ((rows, 1)) so the bench's gate judges them; the backward never in place (it would
    write dx over dy, an input the timing replays)."""
    from liger_kernel.ops import layer_norm, rms_norm

    from rosetta.ops.rms_norm import EPS

    def column(t):
        return t.view(-1, 1)

    if op == "rms_norm" and direction == "forward":
        x, w = inputs

        def forward():
            y, _, rstd, *_ = rms_norm.rms_norm_forward(x, w, EPS, 0.0, "llama", None)
            return y, column(rstd)
        return forward
    if op == "rms_norm":
        x, w, rstd, dy = inputs
        from liger_kernel.ops.utils import calculate_settings

        block, warps = calculate_settings(x.shape[-1])  # what its forward would have chosen
        llama = rms_norm._str_to_casting_mode["llama"]
        return lambda: rms_norm.rms_norm_backward(dy, x, w, rstd.view(-1), 0.0, llama, block, warps, False, None)
    if direction == "forward":
        x, w, b = inputs

        def forward():
            y, _, mean, rstd, *_ = layer_norm.layer_norm_forward(x, w, b, EPS)
            return y, column(mean), column(rstd)
        return forward
    x, w, mean, rstd, dy = inputs
    return lambda: layer_norm.layer_norm_backward(dy, x, w, w, mean.view(-1), rstd.view(-1))
