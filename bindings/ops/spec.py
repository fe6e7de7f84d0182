"""What defines an op, once: its directions (forward, and backward if it is differentiable), each
with its tensors in and out, its non-tensor parameters (eps, p, a seed), fp64 reference, error
yardsticks and napkin math; the view its kernels receive; its headline shapes, test shapes and
reference tiers. Everything else (the C++ argument structs, the torch op schemas, fake tensors,
autograd, tests, bench, tables) is generated or generic over these fields."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch._subclasses.fake_tensor import is_fake

Shape = tuple[int, ...]
ALL_FLOAT = (torch.float32, torch.float16, torch.bfloat16)
HALF = (torch.bfloat16, torch.float16)  # what tensor-core steps take
# What a step's `Layout:` header line may say: contiguous; rows (unit last stride, any row stride);
# rows_or_cols (a 2-D row- or column-major matrix with any leading dimension: what a TMA tensor
# map describes); tma (rows_or_cols whose other strides, outer dimensions' included, and start are
# 16-byte aligned: what a TMA tensor map can be made of, so the dispatcher copies any other tensor
# into 16-byte rows); tma_rows (tma with a unit last stride: a kernel whose boxes are rows, such as
# attention's (batch, heads, seq, head_dim) tiles); any
# (every stride the kernel's pointer arithmetic takes, even 0). A 1-D tensor fits the row layouts
# when its one stride is 1.
LAYOUTS = ("contiguous", "rows", "rows_or_cols", "tma", "tma_rows", "any")
ERROR_BLOCK_ELEMENTS = 2**24  # elements per block of rows when the error is measured in blocks


def address(t: torch.Tensor) -> int:
    """t's address, or while torch.compile traces (fake tensors have none) its offset into its
    storage in bytes: torch allocates storage 16-byte aligned, so only a view's offset misaligns.
    Dynamo traces none of data_ptr(), is_fake() and storage_offset(): 0 there, and the step's own
    checks (Triton's check_tma, traced with fake tensors; CUDA's at launch) judge the real one."""
    if torch.compiler.is_compiling():
        return 0
    try:
        return t.storage_offset() * t.element_size() if is_fake(t) else t.data_ptr()
    except RuntimeError:  # another tracing wrapper (FunctionalTensor)
        return t.storage_offset() * t.element_size()


def as_is(t: torch.Tensor) -> torch.Tensor:
    """A kernel view that is the tensor itself (OpSpec.views: a norm's weight, attention's lse)."""
    return t


def dtype_label(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fits_layout(t: torch.Tensor, layout: str) -> bool:
    """True when the kernel can take t's strides as they are (else the dispatcher copies it)."""
    if layout == "any" or t.numel() <= 1:
        return True
    if layout == "rows":
        return t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1
    if layout in ("rows_or_cols", "tma", "tma_rows") and t.dim() < 2:
        return t.stride(-1) == 1
    if layout in ("rows_or_cols", "tma", "tma_rows"):
        rows, cols = t.shape[-2:]
        row_major = t.stride(-1) == 1 and t.stride(-2) >= cols
        column_major = layout != "tma_rows" and t.stride(-2) == 1 and t.stride(-1) >= rows
        if not (row_major or column_major):
            return False
        if layout == "rows_or_cols":
            return True
        # tma: the pitch and every outer stride (batch, heads) whole 16-byte units, the start too
        pitch = t.stride(-2) if row_major else t.stride(-1)
        outer = [st for st, n in zip(t.stride()[:-2], t.shape[:-2]) if n > 1]
        return all(st > 0 and (st * t.element_size()) % 16 == 0 for st in (pitch, *outer)) and address(t) % 16 == 0
    return t.is_contiguous()


def layout_copy(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The copy a step gets of an input that breaks its layout: contiguous, except that for the
    row layouts the rows start on 16-byte boundaries (the pitch rounded up to 16 bytes), which is
    what 128-bit vector loads and TMA tensor maps need: the copy never turns a fast path away."""
    if t.dim() < 2 or layout not in ("rows", "rows_or_cols", "tma", "tma_rows"):
        return t.contiguous()
    per = max(16 // t.element_size(), 1)
    cols = t.shape[-1]
    pitch = -(-cols // per) * per
    if pitch == cols:  # a fresh tensor: t may be contiguous yet start off 16 bytes (x[1:])
        return t.clone(memory_format=torch.contiguous_format)
    return torch.empty((*t.shape[:-1], pitch), dtype=t.dtype, device=t.device)[..., :cols].copy_(t)


def as_tuple(out) -> tuple:
    """A direction's outputs as a tuple: one output is a tensor, several a tuple of them."""
    return out if isinstance(out, tuple) else (out,)


@dataclass(frozen=True)
class Param:
    """A non-tensor argument (LayerNorm's eps, dropout's p and seed): after the tensors in the torch
    op's schema, the generated C++ struct (a float is a double, an int an int64_t) and the step's
    launch. Tests and bench run the default; the public call takes it as a keyword."""
    name: str
    kind: type  # float or int
    default: float | int


@dataclass(frozen=True)
class Direction:
    """One kernel direction: named `inputs` -> named `outputs` (the names become the torch op
    schema's argument names and the fields of the generated C++ argument struct), with `params`
    after the tensors. One output is returned as a tensor, several as a tuple, by every callable
    below that makes outputs (allocate, reference, the torch tiers) and by the step's torch op."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    make_inputs: Callable  # (shape, dtype, device, generator) -> tuple of fresh random inputs
    allocate: Callable  # (*inputs) -> the empty output(s); also the fake (meta) implementation
    # (*inputs, **params) -> the float64 result(s) torch computes; its keyword defaults are the
    # params' defaults (what tests and bench run)
    reference: Callable
    # max over elements of |out - ref| / scale; scale = error_scale(inputs, ref), per element; with
    # several outputs, a tuple of them (one yardstick per output, each against that output's ref)
    error_scale: Callable | tuple
    tolerance: dict  # dtype -> the largest error that passes
    minimal_bytes: Callable  # (shape, dtype) -> bytes an ideal kernel moves through DRAM
    flops: Callable  # (shape) -> floating-point operations
    # (*inputs, out) -> None: the vendor-library tier, writing into out; or, for an op torch has no
    # out= variant of, its own result (a fresh allocation: from the graph's pool when timed)
    torch_eager: Callable
    torch_expr: Callable  # (*inputs) -> result: what torch.compile compiles for its tier
    # (*inputs, out) -> None: the op as separate torch ops, the way it is written without a fused
    # kernel (the torch/unfused tier); None: no such tier in this direction
    torch_unfused: Callable | None = None
    # extra gate inputs beyond randn: e.g. all-positive data for a sum, where a skipped block hides
    gate_inputs: Callable | None = None  # (shape, dtype, device, generator) -> inputs
    # (inputs, rows) -> the inputs that produce out[rows] (rows: a slice of the first dimension).
    # Given, the error is measured a block of rows at a time: fp64 temporaries of ~128 MB instead
    # of several copies of the whole output (tens of GB for a 4 GB fp32 output).
    row_inputs: Callable | None = None
    params: tuple[Param, ...] = ()
    # inputs and outputs whose dtype is fixed whatever the op's (fp32 statistics saved for the
    # backward): name -> dtype. Every other tensor has the first input's dtype.
    fixed_dtypes: dict = field(default_factory=dict)
    # (inputs, out) -> error: how a torch or peer tier is judged when it cannot match the
    # reference element for element (dropout: torch's own generator draws another mask). None:
    # tiers are judged like steps.
    tier_error: Callable | None = None
    # More reference tiers of this direction, by name: (*inputs, out) -> result, e.g. SDPA with each
    # of its backends forced. Judged like the eager tier.
    more_tiers: dict = field(default_factory=dict)
    # Timed beside the op but not judged, because they compute only part of it: e.g. the bare GEMM
    # under linear_gelu, the time its fused epilogue is measured against. Same signature.
    baselines: dict = field(default_factory=dict)
    # (shape) -> the params a bench shape runs with, where a shape names a case the params decide
    # (attention's causal flag as a 6th entry). None: the defaults. The tiers and the reference
    # get these params after their tensors (and the out of the tiers).
    shape_params: Callable | None = None

    def params_for(self, shape) -> tuple:
        """The params the bench runs `shape` with (its tiers and reference get them too)."""
        return tuple(self.shape_params(shape)) if self.shape_params else self.defaults

    def extra_args(self, shape) -> tuple:
        """What the tiers and the reference get after their tensors at `shape`: the shape's params
        where the spec derives them from the shape, else nothing (their own defaults)."""
        return self.params_for(shape) if self.shape_params else ()

    @property
    def defaults(self) -> tuple:
        """The params' default values, in order: what tests and bench launch with."""
        return tuple(p.default for p in self.params)

    def poisoned(self, *inputs):
        """New outputs filled with NaN (allocate's structure): a kernel that skips an element fails."""
        out = self.allocate(*inputs)
        for t in as_tuple(out):
            t.fill_(float("nan"))
        return out

    def output_errors(self, out, ref, inputs) -> list[tuple[str, tuple]]:
        """(output name, error_report of that output) for every output."""
        scales = self.error_scale if isinstance(self.error_scale, tuple) else (self.error_scale,)
        outs, refs = as_tuple(out), as_tuple(ref)
        if len(outs) != len(self.outputs) or len(refs) != len(self.outputs):
            raise ValueError(f"{len(outs)} outputs, expected {len(self.outputs)} {self.outputs}")
        return [(name, self._error_one(o, r, inputs, scale))
                for name, o, r, scale in zip(self.outputs, outs, refs, scales)]

    def error(self, out: torch.Tensor, ref: torch.Tensor, inputs: tuple) -> float:
        """The normalised worst elementwise error; NaN or Inf where ref is finite gives inf."""
        return self.error_report(out, ref, inputs)[0]

    def error_report(self, out, ref, inputs) -> tuple[float, int, float, float]:
        """(error, flat index of the worst element, its value, the reference there), of the output
        with the largest error (the first of equal ones)."""
        reports = [report for _, report in self.output_errors(out, ref, inputs)]
        return max(reports, key=lambda r: r[0])

    def _error_one(self, out, ref, inputs, error_scale) -> tuple[float, int, float, float]:
        if out.shape != ref.shape:
            raise ValueError(f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        if ref.numel() == 0:
            return 0.0, -1, float("nan"), float("nan")
        if self.row_inputs is None or ref.dim() < 2:  # 1-D: the one dimension is the row
            return self._error_block(out, ref, inputs, error_scale)
        per_row = ref[0].numel()  # > 0: ref is not empty
        step = max(1, ERROR_BLOCK_ELEMENTS // per_row)
        worst = None
        for first in range(0, ref.shape[0], step):
            rows = slice(first, first + step)
            err, at, got, expected = self._error_block(out[rows], ref[rows], self.row_inputs(inputs, rows), error_scale)
            if worst is None or err > worst[0]:  # the first of equal errors, as argmax
                worst = (err, first * per_row + at, got, expected)
        return worst

    @staticmethod
    def _error_block(out, ref, inputs, error_scale) -> tuple[float, int, float, float]:
        out64, ref64 = out.double().flatten(), ref.double().flatten()
        finite_ref = torch.isfinite(ref64)
        # Special values (torch's own NaN/inf rows) must match exactly; elsewhere: scaled error.
        special_ok = torch.where(finite_ref, torch.isfinite(out64),
                                 (out64 == ref64) | (out64.isnan() & ref64.isnan()))
        scale = torch.as_tensor(error_scale(inputs, ref), dtype=torch.float64, device=ref.device)
        scale = scale.expand_as(ref).flatten().clamp_min(torch.finfo(torch.float64).tiny)
        diff = torch.where(finite_ref, (out64 - ref64).abs() / scale, torch.zeros_like(ref64))
        diff = torch.where(special_ok, diff.nan_to_num(float("inf")), torch.full_like(diff, float("inf")))
        worst = int(diff.argmax())
        return float(diff[worst]), worst, float(out64[worst]), float(ref64[worst])


@dataclass(frozen=True)
class Headline:
    """A shape of the ladder tables, with the dtypes measured at it (one table per dtype)."""
    shape: Shape
    dtypes: tuple
    note: str = ""  # shown beside the table title, e.g. "long rows"


@dataclass(frozen=True)
class SweepAxis:
    """What the sweep plot's x-axis shows: one number per swept shape (e.g. softmax's row length,
    where every swept shape holds the same number of elements)."""
    name: str  # the title reads "throughput vs <name>"
    label: str  # the axis label
    of_shape: Callable  # (shape tuple) -> the x value
    note: str = ""  # a line printed in the plot's corner


@dataclass(frozen=True)
class Suite:
    """The shapes users bring, small and odd ones included: every step that takes a case is timed
    on it beside torch, the fastest of each backend goes into the dispatch table (step=None), and
    the dispatched call is timed again as an eager call. One heatmap per op and backend: `rows`
    and `cols` name its axes and give each case's label on them."""
    cases: tuple[tuple[Shape, torch.dtype], ...]
    rows: tuple[str, Callable]  # (axis name, (shape, dtype) -> label) of the heatmap's rows
    cols: tuple[str, Callable]  # (axis name, (shape, dtype) -> label) of its columns


@dataclass(frozen=True)
class OpSpec:
    name: str
    position: int  # where the op stands in rosetta.OPS (teaching order)
    forward: Direction
    check_shapes: Callable  # (label, *inputs) -> None; raises ValueError saying what was expected
    # The view a kernel receives: (*tensors) -> same tensors reshaped (softmax: rows x cols).
    # Applied to inputs and output alike; it never copies (a copy is the layout check's business).
    kernel_view: Callable
    headlines: tuple[Headline, ...]
    sweep: tuple[Shape, ...]  # throughput vs size (or vs sweep_axis), best steps and tiers
    sweep_dtype: torch.dtype
    test_shapes: tuple[Shape, ...]  # GPU: every step x dtype x these (each with a comment in the spec)
    cpu_shapes: tuple[Shape, ...]  # CPU: Triton steps under the interpreter, small
    backward: Direction | None = None
    # Autograd through the same step: setup(ctx, inputs, output(s), params) and
    # grads(step_ops, ctx, *grads) -> one gradient per tensor input (None where not needed; the
    # params get none); step_ops.forward / .backward take (*tensors, *params) and are that step's
    # torch ops (or, in an eager call, its kernels). None: the op is not differentiable.
    autograd: tuple[Callable, Callable] | None = None
    dtypes: tuple = ALL_FLOAT  # what a step takes unless its header says `Dtypes:`
    layout: str = "contiguous"  # what a step assumes unless its header says `Layout:`
    metric: str = "GB/s"  # what the throughput column reports: "GB/s" or "TFLOP/s"
    ceiling: str = "dram_copy"  # the measured ceiling (hardware.json) that "% of ceiling" divides by
    tiers: tuple = ()  # CUDA-library tiers built beside the steps, e.g. ("cub",)
    peers: tuple = ()  # peer-library tiers, e.g. ("liger",): bench/run/tiers.py knows how to run them
    # Quantities a step's `Max:` header line may bound, e.g. {"cols": lambda x: x.shape[-1]}
    bounds: dict = field(default_factory=dict)
    # A step whose first call takes longer than this at a headline shape is timed only at the
    # shapes where it is quicker (the table says so): the naive matmul at 8192^3 takes seconds.
    slow_call_ms: float = 200.0
    # Other input layouts the bench times the best step of each backend on, beside the library
    # tier: name -> (*inputs) -> the same values in that layout (e.g. "a.t()"), at these shapes
    input_layouts: dict = field(default_factory=dict)
    layout_headlines: tuple[Headline, ...] = ()
    # The sweep plot's x-axis; None: the elements of each shape (numel; M x K x N for matmul)
    sweep_axis: SweepAxis | None = None
    # The reference tiers a sweep times, by name; None: every tier. Where the slow references (the
    # unfused formula, its torch.compile) take most of an op's bench time and add little to a
    # throughput-vs-size plot, the sweep leaves them to the headline tables.
    sweep_tiers: tuple[str, ...] | None = None
    # The shape `make profile` runs every subject at, in the first headline's first dtype it takes;
    # None: the first headline each subject takes. Nsight Compute replays a kernel once per metric
    # pass and restores the memory it writes between passes, so an op whose slow tiers write GiBs
    # at the headline (attention's unfused formula) is profiled at a smaller case.
    profile_shape: tuple | None = None
    # (*forward inputs) -> the problem's shape as the shapes above write it (softmax: rows, cols;
    # matmul: M, K, N): what the dispatch table matches a call against. None: the first input's.
    problem: Callable | None = None
    suite: Suite | None = None  # the shapes users bring (bench --suite): what step=None is chosen from
    # (*forward inputs) -> tensors shaped as the backward's inputs will be (softmax: y and dy, both
    # x's shape): with a gradient to take, a step's declared limits are checked on these too, before
    # the forward runs. None: the backward runs the forward on other inputs (matmul).
    backward_inputs: Callable | None = None
    # The view of a tensor the kernel_view does not suit, by name: e.g. {"weight": identity} for a
    # norm's weight of the row's length beside rows x cols inputs
    views: dict = field(default_factory=dict)
    # Forward outputs kept for the backward that the public call does not return (a norm's fp32
    # mean and rstd; attention's log-sum-exp): the step's torch op returns them all
    saved: tuple[str, ...] = ()

    def view(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The kernel's view of the tensor called `name` (an input's or an output's)."""
        view = self.views.get(name)
        return view(t) if view else self.kernel_view(t)[0]

    def public_outputs(self) -> int:
        """How many of the forward's outputs (the first ones) the public call returns."""
        return len(self.forward.outputs) - len(self.saved)

    def problem_shape(self, *inputs) -> Shape:
        return tuple(self.problem(*inputs)) if self.problem else tuple(inputs[0].shape)

    def directions(self) -> dict[str, Direction]:
        return {"forward": self.forward, **({"backward": self.backward} if self.backward else {})}
