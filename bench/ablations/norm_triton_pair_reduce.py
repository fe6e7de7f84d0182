"""layer_norm's Triton steps 3 and 4 with a row's two sums taken by one tl.reduce over the pair,
against the steps as they stand. The variant lives in commit c520f7e (and was reverted after this
measurement): backward, sum(g * xhat) and sum(g) as one reduction (steps 3 and 4; PTX at 4,096
columns and 16 warps: 7 bar.sync a tile against 10 in step 3); step 3's forward, shifted sums of
d = x - x[0] and d^2 in one reduction (CUDA step 3's formula) where it took the mean, then the
variance of x - mean. The question: is the second cross-warp reduction what keeps layer_norm's
backward behind rms_norm's (step 3 at bf16 4096^2: 48.7 us against 37.1, run c27de173e145)?

Subjects per shape, bf16: step 3 and step 4 (backward) or step 3 (forward), each as committed at
REF ('before', default 961c813: the steps as they were), at c520f7e ('pair') and as in the working
tree ('now'); rms_norm's steps of the working tree for scale. Each
subject's outputs, written over NaN, are checked against the op spec's fp64 reference and
tolerance first; then all are timed in turns with the bench's method (CUDA-graph replays, L2
flushed, median; rosetta.timing.measure_in_turns). GB/s counts 3 x |x| backward, 2 x |x| forward.
On a GPU box, from the repository root: python bench/ablations/norm_triton_pair_reduce.py [REF]
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

PAIR = "c520f7e"
STEP_FILES = {3: "03_prefetched_partials.py", 4: "04_split_rows.py"}
SHAPES = {"backward": ((4096, 4096), (16384, 8192), (32768, 4096), (4096, 32768)),
          "forward": ((4096, 4096), (16384, 8192), (32768, 4096), (4096, 32768))}


def module_at(ref, op, step):
    """The step's module as committed at `ref` (it imports today's shared modules, unchanged since)."""
    path = f"triton-kernels/{op}/{STEP_FILES[step]}"
    source = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"{op}_{step}_at_{ref.replace('~', '_')}", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def working_tree(op, step):
    return triton_module(next(v for v in rosetta.variants(op=op, backend="triton") if v.step == step))


def main(ref):
    flush = Flush("read")
    for direction, shapes in SHAPES.items():
        steps = (3, 4) if direction == "backward" else (3,)
        subjects_at = [(f"ln{s} {label}", "layer_norm", module_at(at, "layer_norm", s) if at else working_tree("layer_norm", s))
                       for s in steps for label, at in (("before", ref), ("pair", PAIR), ("now", None))]
        subjects_at += [(f"rms{s}", "rms_norm", working_tree("rms_norm", s)) for s in steps]
        for rows, cols in shapes:
            names, subjects, nbytes = [], [], None
            for name, op, module in subjects_at:
                d = SPECS[op].directions()[direction]
                inputs = d.make_inputs((rows, cols), torch.bfloat16, "cuda", torch.Generator(device="cuda").manual_seed(0))
                params = d.params_for((rows, cols))
                ref_out = d.reference(*inputs, *params)
                outs = d.poisoned(*inputs)  # NaN: an element the kernel skips fails the check
                call = module.launch_backward if direction == "backward" else module.launch

                def launch(call=call, inputs=inputs, outs=outs, params=params):
                    call(*inputs, *outs, *params)
                launch()
                torch.cuda.synchronize()
                err = d.error(outs, ref_out, inputs)  # the tests' yardstick; NaN gives inf
                if not err <= d.tolerance[torch.bfloat16]:
                    print(f"  WRONG {name}: error {err:.3g} of tolerance {d.tolerance[torch.bfloat16]}", flush=True)
                    continue
                names.append(name)
                subjects.append([launch])
                nbytes = (3 if direction == "backward" else 2) * inputs[0].numel() * inputs[0].element_size()
            times = [r["p50_ms"] * 1e3 for r in measure_in_turns(subjects, flush)]
            row = "  ".join(f"{n} {t:.1f} us {nbytes / (t * 1e3):,.0f}" for n, t in zip(names, times))
            print(f"{direction} bf16 {rows}x{cols}: {row}", flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# layer_norm Triton steps 3-4, one reduction over the pair of row sums (bench/ablations/norm_triton_pair_reduce.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us (p50 of CUDA-graph replays, L2 flushed, every subject in turns) and GB/s")
    main(sys.argv[1] if len(sys.argv) > 1 else "961c813")
