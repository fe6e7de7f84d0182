"""`make bench` on a machine with no GPU: the parts that need none."""
from __future__ import annotations

import torch

import rosetta
from rosetta.ops import SPECS

from . import environment, lines, results, tables


def main(args) -> int:
    ops = args.op or rosetta.ops_with_steps()
    failures = 0
    print("\nTriton steps under the interpreter (fp32, fp16; the spec's small CPU shapes):")
    gen = torch.Generator().manual_seed(0)
    for op in ops:
        spec = SPECS[op]
        for v in rosetta.variants(op, "triton"):
            for direction, d in spec.directions().items():
                for dtype in (t for t in (torch.float32, torch.float16) if t in v.dtypes):
                    worst = 0.0
                    for shape in spec.cpu_shapes:
                        inputs = d.make_inputs(shape, dtype, "cpu", gen)
                        try:
                            out = v(*inputs) if direction == "forward" else v.backward(*inputs)
                        except ValueError:  # a declared limit: this step does not take the shape
                            continue
                        worst = max(worst, d.error(out, d.reference(*inputs), inputs))
                    ok = worst <= d.tolerance[dtype]
                    failures += not ok
                    print(f"  {v.label:40s} {direction:8s} {str(dtype):15s} worst error / tol. "
                          f"{worst / d.tolerance[dtype]:.2f} {'ok' if ok else 'WRONG'}")

    print("\nLines of code per step (lizard NLOC; device = __global__/__device__/@triton.jit bodies):")
    for op in ops:
        for v in rosetta.variants(op):
            c = lines.count(rosetta.registry.REPO / v.source)
            print(f"  {v.label:40s} device {c.device_nloc:4d} NLOC {c.device_tokens:5d} tokens | "
                  f"host {c.host_nloc:4d} NLOC")

    for folder in sorted(p for p in environment.RESULTS.glob("*") if (p / "bench.csv").exists()):
        env = results.read_environment(folder / "environment.json")
        rows = results.read_rows(folder / "bench.csv")
        print(f"\nLast committed GPU results: {folder.name} ({env.get('gpu')}, {env.get('git_sha')}, "
              f"{env.get('date_utc')})")
        for op in ops:
            print("\n" + tables.all_ladder_tables(rows, op, level="###"))
    return 1 if failures else 0
