"""Peer libraries as bench tiers, when they import: Liger-Kernel's Triton softmax (forward and
backward). A peer that is not installed, or that refuses a shape, is named in the table as such."""
from __future__ import annotations

import importlib

LIGER_MAX_COLS = 65536  # liger_kernel.ops.utils.calculate_settings: MAX_FUSED_SIZE


def available(peer: str) -> bool:
    try:
        importlib.import_module({"liger": "liger_kernel.ops.softmax"}[peer])
        return True
    except Exception:  # absent, or its import fails on this machine
        return False


def takes(peer: str, op: str, direction: str) -> bool:
    return peer == "liger" and op == "softmax"


def runner(peer: str, op: str, direction: str, inputs: tuple):
    """A zero-argument call of the peer's kernels on `inputs` (it allocates its own output).
    Raises ValueError for a peer that is absent or refuses the shape: the bench reports it."""
    if not available(peer):
        raise ValueError(f"{peer} is not installed (pip install liger-kernel)")
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
