"""The Triton norms' step 4 backward: its exchange one row behind the sums, against the version
before it (each program waiting for its peers' partials of the row it had just summed), and the
grid's values a thread and slice width varied. The variant measured slower on every shape and was
not kept: it lives in commit d63be87 (step 4's kernels and norm_common's post / peek / gather and
BACKWARD_VALUES), which this script runs as the working tree. To repeat the run:
git checkout d63be87 && python bench/ablations/norm_triton_04_exchange.py d63be87~1

Subjects per op and shape, bf16 unless named:
  before        step 4 as committed at REF, its own plan (16 values a thread and tensor, slices
                of 2,048)
  now           the working tree's step 4 and plan (8 values, slices of 2,048)
  now v16       the working tree's kernel at 16 values a thread and tensor
  now s4096     the working tree's kernel with slices of 4,096
Each subject's dx, dweight (and dbias), written over NaN, are checked against the op spec's fp64
reference and tolerance first, then all are timed in turns
with the bench's method (CUDA-graph replays, L2 flushed, median; rosetta.timing.measure_in_turns).
GB/s counts 3 x |x| bytes, as the bench does. On a GPU box, from the repository root:
python bench/ablations/norm_triton_04_exchange.py REF
"""
import importlib.util
import subprocess
import sys
import tempfile

import torch

import rosetta
from rosetta.bench import environment
from rosetta.ops import SPECS
from rosetta.timing import Flush, measure_in_turns
from rosetta.torch_ops import triton_module
from rosetta.triton_kernels import norm_common

SHAPES = ((4096, 32768), (4096, 4096), (16384, 8192), (32768, 4096), (4096, 65536))
FP32_SHAPES = ((4096, 4096),)


def module_at(ref, op):
    """Step 4's module as committed at `ref` (it imports today's norm_common, whose split_plan
    with its default values is the plan it was written for)."""
    path = f"triton-kernels/{op}/04_split_rows.py"
    source = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"{op}_04_at_{ref.replace('~', '_')}", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_plan(launch, values=None, slice_width=None):
    """launch() with norm_common's backward values (16-bit) or slice width set around it."""
    def run():
        kept = dict(norm_common.BACKWARD_VALUES), norm_common.SPLIT_SLICE
        if values is not None:
            norm_common.BACKWARD_VALUES[2] = values
        if slice_width is not None:
            norm_common.SPLIT_SLICE = slice_width
        try:
            launch()
        finally:
            norm_common.BACKWARD_VALUES.clear()
            norm_common.BACKWARD_VALUES.update(kept[0])
            norm_common.SPLIT_SLICE = kept[1]
    return run


def main(ref):
    flush = Flush("read")
    for op in ("layer_norm", "rms_norm"):
        now = triton_module(next(v for v in rosetta.variants(op=op, backend="triton") if v.step == 4))
        before = module_at(ref, op)
        d = SPECS[op].directions()["backward"]
        for dtype, shapes in ((torch.bfloat16, SHAPES), (torch.float32, FP32_SHAPES)):
            for rows, cols in shapes:
                inputs = d.make_inputs((rows, cols), dtype, "cuda", torch.Generator(device="cuda").manual_seed(0))
                ref_out = d.reference(*inputs)
                x = inputs[0]
                names, subjects = [], []

                def add(name, module, wrap=lambda f: f):
                    outs = d.poisoned(*inputs)  # NaN: an element the kernel skips fails the check
                    launch = wrap(lambda: module.launch_backward(*inputs, *outs))
                    launch()
                    torch.cuda.synchronize()
                    err = d.error(outs, ref_out, inputs)  # the tests' yardstick; NaN gives inf
                    if not err <= d.tolerance[dtype]:
                        print(f"  WRONG {name}: error {err:.3g} of tolerance {d.tolerance[dtype]}", flush=True)
                        return
                    names.append(name)
                    subjects.append([launch])

                add("before", before)
                add("now", now)
                if dtype == torch.bfloat16:
                    add("now v16", now, lambda f: with_plan(f, values=16))
                    if cols * 2 > norm_common.SPLIT_ROW_BYTES:
                        add("now s4096", now, lambda f: with_plan(f, slice_width=4096))
                times = [r["p50_ms"] * 1e3 for r in measure_in_turns(subjects, flush)]
                gbs = [3 * x.numel() * x.element_size() / (t * 1e3) for t in times]
                row = "  ".join(f"{n} {t:.1f} us {g:,.0f}" for n, t, g in zip(names, times, gbs))
                print(f"{op} backward {str(dtype).removeprefix('torch.')} {rows}x{cols}: {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# Triton norms' step 4 backward: the exchange one row behind (bench/ablations/norm_triton_04_exchange.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns) and GB/s (3 x |x|)")
    main(sys.argv[1] if len(sys.argv) > 1 else "HEAD")
