"""`make bench` on a machine with no GPU: the parts that need none."""
from __future__ import annotations

import warnings

import torch

import rosetta
from rosetta.ops import SPECS
from rosetta.ops.spec import as_tuple

from .. import environment, lines, results


def interpreter_checks(ops, step=None) -> int:
    """Every Triton step (or only `step`) on the spec's CPU shapes, fp32 and fp16, against fp64.
    A step is judged only on shapes it computes: an empty result or a declared refusal checks
    nothing, and a step left with no such shape says so instead of passing."""
    failures = 0
    # numpy's warnings on rows meant to give NaN (-inf - -inf, 0 * inf): expected, and checked
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    print("\nTriton steps under the interpreter (fp32, fp16; the spec's small CPU shapes):")
    gen = torch.Generator().manual_seed(0)
    for op in ops:
        spec = SPECS[op]
        for v in rosetta.variants(op, "triton"):
            if step is not None and v.step != step:
                continue
            for direction, d in spec.directions().items():
                for dtype in (t for t in (torch.float32, torch.float16) if t in v.dtypes):
                    worst, computed = 0.0, []
                    for shape in spec.cpu_shapes:
                        inputs = d.make_inputs(shape, dtype, "cpu", gen)
                        try:
                            out = v(*inputs) if direction == "forward" else v.backward(*inputs)
                        except ValueError:  # a declared limit: this step does not take the shape
                            continue
                        if all(t.numel() for t in (*as_tuple(out), *inputs)):
                            computed.append("x".join(map(str, shape)))
                        worst = max(worst, d.error(out, d.reference(*inputs), inputs))
                    tol = d.tolerance[dtype]
                    if not computed:
                        print(f"  {v.label:40s} {direction:8s} {str(dtype):15s} not checked: no CPU shape "
                              "it takes is non-empty (its limits; the GPU tests cover it)")
                        continue
                    ok = worst <= tol
                    failures += not ok
                    error = f"abs. error {worst:.3g} (exact)" if tol == 0 else f"worst error / tol. {worst / tol:.2f}"
                    print(f"  {v.label:40s} {direction:8s} {str(dtype):15s} {error} on {len(computed)} shapes "
                          f"{'ok' if ok else 'WRONG'}")
    return failures


def main(args) -> int:
    ops = args.op or rosetta.ops_with_steps()
    failures = 0
    if args.backend == "cuda" or args.backend == "torch":
        print(f"\n--backend {args.backend}: nothing of it runs without a GPU here (CUDA steps and torch's CUDA "
              "tiers need one); showing line counts and the committed results.")
    else:
        failures += interpreter_checks(ops, args.step)
    print("\nLines of code per step (lizard NLOC; device = __global__/__device__/@triton.jit bodies):")
    for op in ops:
        for v in rosetta.variants(op, args.backend if args.backend in rosetta.BACKENDS else None):
            if args.step is not None and v.step != args.step:
                continue
            c = lines.count(rosetta.registry.REPO / v.source)
            print(f"  {v.label:40s} device {c.device_nloc:4d} NLOC {c.device_tokens:5d} tokens | "
                  f"host {c.host_nloc:4d} NLOC")

    for folder in sorted(p for p in environment.RESULTS.glob("*") if (p / "bench.csv").exists()):
        env = results.read_environment(folder / "environment.json")
        rows = results.read_rows(folder / "bench.csv")
        print(f"\nLast committed GPU results: {folder.relative_to(environment.RESULTS.parent)} ({env.get('gpu')}, "
              f"run {env.get('git_sha')}, {env.get('date_utc')}): {len(rows)} rows in bench.csv; the tables are "
              "in README.md, KERNEL_LOG.md and `make site`'s site.")
    return 1 if failures else 0
