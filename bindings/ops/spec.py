"""What defines an op, once: its inputs, checks, fp64 reference, napkin math and bench shapes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

Shape = tuple[int, ...]
ALL_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple[str, ...]  # argument names, in order (the torch op schema uses them)
    check_shapes: Callable  # (label, *inputs) -> None; raises ValueError saying what was expected
    allocate: Callable  # (*inputs) -> empty output; also the fake (meta) implementation
    reference: Callable  # (*inputs) -> float64 result computed by torch
    torch_eager: Callable  # (*inputs, out) -> None: the vendor-library tier, writing into out
    torch_expr: Callable  # (*inputs) -> result: what torch.compile compiles for its tier
    make_inputs: Callable  # (shape, dtype, device, generator) -> tuple of fresh random inputs
    minimal_bytes: Callable  # (shape, dtype) -> bytes an ideal kernel moves through DRAM
    flops: Callable  # (shape) -> floating-point operations of the op
    headline: Shape  # the shape of the ladder table
    sweep: tuple[Shape, ...]  # the throughput-vs-size plot
    tolerance: dict = field(default_factory=dict)  # dtype -> max relative error vs fp64
    dtypes: tuple = ALL_FLOAT
    metric: str = "GB/s"  # what the throughput column reports: "GB/s" or "TFLOP/s"
    ceiling: str = "dram_copy"  # the measured ceiling (hardware.json) that "% of ceiling" divides by
    # The error's yardstick: ||ref|| by default; a sum uses sum|x| (its condition number).
    error_scale: Callable = lambda inputs, ref: ref.norm().item()  # noqa: E731
    tiers: tuple = ()  # reference tiers beyond torch eager/compile, e.g. ("cub",)

    def relative_error(self, out: torch.Tensor, ref: torch.Tensor, inputs: tuple) -> float:
        """||out - ref|| / scale in fp64; NaN or Inf anywhere gives inf (never passes)."""
        out64 = out.double()
        if not torch.isfinite(out64).all():
            return float("inf")
        scale = self.error_scale(inputs, ref)
        diff = (out64 - ref).norm().item()
        return diff / scale if scale > 0 else diff
