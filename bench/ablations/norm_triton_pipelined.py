"""The Triton norms' backward with its row loads pipelined by the compiler: step 4's kernels with
the hand-written prefetch (the next row's slices loaded at the top of each row) replaced by
`tl.range(..., num_stages=STAGES)`, which Triton's software pipeliner compiles into cp.async copies
into a ring of STAGES - 1 rows in shared memory (the PTX of the 4,096-column kernel: 24 cp.async,
no ld.global.v4, 49 KB of shared memory at 3 stages): more bytes in flight a program without
registers to hold them, as CUDA step 4's bulk copies into a shared ring.

Subjects per op and shape (bf16; one fp32 shape): steps 3 and 4 as committed, and the candidate
at STAGES = 2, 3, 4 on step 4's grid (norm_common.split_plan). Each subject's dx, dweight (and
dbias), written over NaN, are checked against the op spec's fp64 reference and tolerance first,
then all are timed in turns with the bench's method
(CUDA-graph replays, L2 flushed, median; rosetta.timing.measure_in_turns). GB/s counts 3 x |x|.
On a GPU box, from the repository root: python bench/ablations/norm_triton_pipelined.py
"""
import torch
import triton
import triton.language as tl

import rosetta
from rosetta.bench import environment
from rosetta.ops import SPECS
from rosetta.timing import Flush, measure_in_turns
from rosetta.torch_ops import triton_module
from rosetta.triton_kernels.common import next_power_of_2
from rosetta.triton_kernels.norm_common import (empty_partials, share, split_kernel, split_plan, split_workspace,
                                                sum_counted_partials)

SHAPES = ((4096, 4096), (4096, 32768), (16384, 8192), (32768, 4096), (4096, 8192))
FP32_SHAPES = ((4096, 4096),)
STAGES = (2, 3, 4)


@triton.jit
def layer_norm_backward_pipelined(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, partial_ptr, part_ptr, count_ptr,
                                  rows, cols, x_row_stride, dy_row_stride, slices, SLICE: tl.constexpr,
                                  SLICES_P2: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    s = pid % slices
    group = pid // slices
    groups = tl.num_programs(0) // slices
    if pid == 0:
        tl.store(count_ptr, groups)
    c = s * SLICE + tl.arange(0, SLICE)
    c_mask = c < cols
    dw = tl.zeros([SLICE], tl.float32)
    db = tl.zeros([SLICE], tl.float32)
    for row in tl.range(group.to(tl.int64), rows, groups, num_stages=STAGES):
        x = tl.load(x_ptr + row * x_row_stride + c, mask=c_mask, other=0.0)
        dy = tl.load(dy_ptr + row * dy_row_stride + c, mask=c_mask, other=0.0)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(c_mask, (x.to(tl.float32) - mean) * rstd, 0.0)
        dyf = dy.to(tl.float32)
        g = dyf * tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
        sum_g = tl.sum(g, axis=0)
        sum_gx = tl.sum(g * xhat, axis=0)
        if slices > 1:
            gs, gxs = share(part_ptr, row, rows, s, slices, sum_g, sum_gx, SLICES_P2, True)
            sum_g = tl.sum(gs, axis=0)
            sum_gx = tl.sum(gxs, axis=0)
        dx = rstd * (g - (sum_g + xhat * sum_gx) / cols)
        tl.store(dx_ptr + row * cols + c, dx.to(dx_ptr.dtype.element_ty), mask=c_mask)
        dw += dyf * xhat
        db += dyf
    p = partial_ptr + group.to(tl.int64) * cols + c
    tl.store(p, dw, mask=c_mask)
    tl.store(p + groups.to(tl.int64) * cols, db, mask=c_mask)


@triton.jit
def rms_norm_backward_pipelined(x_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, partial_ptr, part_ptr, count_ptr, rows, cols,
                                x_row_stride, dy_row_stride, slices, SLICE: tl.constexpr, SLICES_P2: tl.constexpr,
                                STAGES: tl.constexpr):
    pid = tl.program_id(0)
    s = pid % slices
    group = pid // slices
    groups = tl.num_programs(0) // slices
    if pid == 0:
        tl.store(count_ptr, groups)
    c = s * SLICE + tl.arange(0, SLICE)
    c_mask = c < cols
    acc = tl.zeros([SLICE], tl.float32)
    for row in tl.range(group.to(tl.int64), rows, groups, num_stages=STAGES):
        x = tl.load(x_ptr + row * x_row_stride + c, mask=c_mask, other=0.0)
        dy = tl.load(dy_ptr + row * dy_row_stride + c, mask=c_mask, other=0.0)
        rstd = tl.load(rstd_ptr + row)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        g = dyf * tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
        dot = tl.sum(g * xf, axis=0)
        if slices > 1:
            parts, _ = share(part_ptr, row, rows, s, slices, dot, 0.0, SLICES_P2, False)
            dot = tl.sum(parts, axis=0)
        dx = rstd * (g - xf * (rstd * rstd * dot / cols))
        tl.store(dx_ptr + row * cols + c, dx.to(dx_ptr.dtype.element_ty), mask=c_mask)
        acc += dyf * xf * rstd
    tl.store(partial_ptr + group.to(tl.int64) * cols + c, acc, mask=c_mask)


def pipelined(op, stages):
    """The candidate's launch_backward for `op` at `stages`, on step 4's grid: (*inputs, *outputs) in
    the op spec's order, as the steps' own launch_backward."""
    kernel = layer_norm_backward_pipelined if op == "layer_norm" else rms_norm_backward_pipelined
    n_inputs = len(SPECS[op].directions()["backward"].inputs)

    def launch_backward(*tensors):
        inputs, dx, sums = tensors[:n_inputs], tensors[n_inputs], tensors[n_inputs + 1:]  # sums: dweight (, dbias)
        x, dy = inputs[0], inputs[-1]
        rows, cols = x.shape
        width, warps, per_sm, slices, groups = split_plan(x.device, int(rows), int(cols), x.element_size())
        part = split_workspace(rows, slices, x.device)
        count = torch.empty(1, dtype=torch.int32, device=x.device)
        partial = empty_partials(len(sums), groups, cols, x.device)
        split_kernel(kernel, warps, per_sm)[(groups * slices,)](
            *inputs, dx, partial, part, count, rows, cols, x.stride(0), dy.stride(0), slices, SLICE=width,
            SLICES_P2=next_power_of_2(slices), STAGES=stages)
        sum_counted_partials(partial, count, *sums)
    return launch_backward


def main():
    flush = Flush("read")
    for op in ("layer_norm", "rms_norm"):
        steps = {n: triton_module(next(v for v in rosetta.variants(op=op, backend="triton") if v.step == n)).launch_backward
                 for n in (3, 4)}
        d = SPECS[op].directions()["backward"]
        for dtype, shapes in ((torch.bfloat16, SHAPES), (torch.float32, FP32_SHAPES)):
            for rows, cols in shapes:
                inputs = d.make_inputs((rows, cols), dtype, "cuda", torch.Generator(device="cuda").manual_seed(0))
                ref_out = d.reference(*inputs)
                x = inputs[0]
                names, subjects = [], []
                candidates = [(f"step {n}", f) for n, f in steps.items()] + [(f"pipelined {s}", pipelined(op, s)) for s in STAGES]
                for name, launch_backward in candidates:
                    outs = d.poisoned(*inputs)  # NaN: an element the kernel skips fails the check
                    launch = (lambda f=launch_backward, outs=outs: f(*inputs, *outs))
                    try:
                        launch()
                        torch.cuda.synchronize()
                    except Exception as e:  # a candidate that does not compile or fit is reported, not timed
                        print(f"  FAILED {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                        continue
                    err = d.error(outs, ref_out, inputs)  # the tests' yardstick; NaN gives inf
                    if not err <= d.tolerance[dtype]:
                        print(f"  WRONG {name}: error {err:.3g} of tolerance {d.tolerance[dtype]}", flush=True)
                        continue
                    names.append(name)
                    subjects.append([launch])
                times = [r["p50_ms"] * 1e3 for r in measure_in_turns(subjects, flush)]
                gbs = [3 * x.numel() * x.element_size() / (t * 1e3) for t in times]
                row = "  ".join(f"{n} {t:.1f} us {g:,.0f}" for n, t, g in zip(names, times, gbs))
                print(f"{op} backward {str(dtype).removeprefix('torch.')} {rows}x{cols}: {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# Triton norms' backward, row loads pipelined by tl.range(num_stages) (bench/ablations/norm_triton_pipelined.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns) and GB/s (3 x |x|)")
    main()
