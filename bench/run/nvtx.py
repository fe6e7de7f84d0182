"""NVTX ranges around every step's launch: domain `rosetta`, nested <op> / <backend> / <NN>_<name>,
so the stack reads as the step's label and `ncu --nvtx-include 'rosetta@<op>/'` selects an op.

Uses the `nvtx` package when importable (it has domains), else torch.cuda.nvtx (no domains: the
ncu filter then drops the `rosetta@` prefix), else nothing (CPU)."""
from __future__ import annotations

from contextlib import contextmanager

import torch

try:
    import nvtx as _nvtx
except ImportError:
    _nvtx = None

DOMAIN = "rosetta"
KIND = "nvtx" if _nvtx else ("torch" if torch.cuda.is_available() else "none")


def ncu_filter(op: str) -> str:
    """The --nvtx-include expression that selects every launch of `op`."""
    return f"{DOMAIN}@{op}/" if KIND == "nvtx" else f"{op}/"


def _push(name: str) -> None:
    if KIND == "nvtx":
        _nvtx.push_range(message=name, domain=DOMAIN)
    elif KIND == "torch":
        torch.cuda.nvtx.range_push(name)


def _pop() -> None:
    if KIND == "nvtx":
        _nvtx.pop_range(domain=DOMAIN)
    elif KIND == "torch":
        torch.cuda.nvtx.range_pop()


@contextmanager
def step_range(label: str):
    """Push one range per part of `<op>/<backend>/<NN>_<name>`; pop them all on exit."""
    parts = label.split("/")
    for part in parts:
        _push(part)
    try:
        yield
    finally:
        for _ in parts:
            _pop()
