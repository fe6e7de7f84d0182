"""python -m rosetta.bench [--op OP] [--backend B] [--step N] [--quick] [--flush-check] [--suite] [--changed] [--overhead]

On a GPU: every tier and step of the selected ops, correctness first, then timing; writes
results/<gpu>/bench.csv, environment.json and plots, and regenerates the KERNEL_LOG/README tables.
Without a GPU: says so, then does the CPU part (interpreter correctness, line counts, the last
committed GPU results)."""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch


def parse_args(argv=None):
    from rosetta.registry import BACKENDS, OPS

    p = argparse.ArgumentParser(prog="python -m rosetta.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", choices=OPS, action="append", help="op(s) to run (default: all with steps)")
    p.add_argument("--backend", choices=(*BACKENDS, "torch"), help="only this backend, beside torch eager (the ratios' reference); torch = every tier; "
                        "with --suite, the other backend's rows of the cases are kept")
    p.add_argument("--step", type=int, help="only this step number (with --backend)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: first headline shape and dtype, no sweep; writes bench-quick.csv")
    p.add_argument("--flush-check", action="store_true",
                   help="only the flush comparison: one memory-bound kernel under each flush and sustained")
    p.add_argument("--suite", action="store_true",
                   help="only the shape suite of the selected ops: every step on the shapes users bring, "
                        "the dispatch table step=None reads (dispatch.json), suite.md and heatmaps")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), action="append",
                   help="with --suite: only the cases of this dtype (the suite in parts of a few minutes each)")
    p.add_argument("--changed", action="store_true",
                   help="only the ops (whole, every tier and step) with a step whose code changed since "
                        "the run that measured its rows in results/<gpu>/bench.csv")
    p.add_argument("--overhead", action="store_true",
                   help="only the host cost per call: torch, each backend's public call and the layers under it")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.changed:
        args.op = changed_ops(args.op)
        if not args.op:
            print("No step's code changed since the run that measured its rows: nothing to re-run.")
            return 0
    if not torch.cuda.is_available():
        print("No CUDA GPU here: running the CPU part instead (Triton interpreter correctness at "
              "small sizes, line counts per step, the last committed GPU results).")
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        from .run.cpu import main as cpu_main

        return cpu_main(args)
    return gpu_main(args)


def changed_ops(among=None) -> list:
    """The ops (of `among`, else all) with a step whose rows in this GPU's results (the reference
    GPU's without one) measured code that has changed since, each named with its steps."""
    import rosetta

    from . import environment, results
    from .docs import report

    folder = environment.results_dir() if torch.cuda.is_available() else report.reference_results()
    changed = results.changed_since_run(folder, rosetta.variants()) if folder else {}
    ops = [op for op in (among or rosetta.ops_with_steps()) if any(v.op == op for v in changed)]
    for op in ops:
        print(f"{op}: changed since their rows' run: "
              + ", ".join(f"{v.label} ({run})" for v, run in changed.items() if v.op == op))
    return ops


def gpu_main(args) -> int:
    import rosetta
    from rosetta import timing

    from . import ceilings, environment, results
    from .docs import report, tables
    from .run import flush_check, suite

    start = time.monotonic()
    ops = args.op or rosetta.ops_with_steps()
    env = environment.collect()
    out_dir = environment.results_dir(env["gpu"])
    limits = ceilings.load(out_dir)
    print(f"{env['gpu']} | driver {env['driver']} | CUDA {env['cuda_runtime']} | torch {env['torch']} | "
          f"triton {env['triton']} | {env['git_sha']}\ntiming: {suite.TIMING_METHOD}\n"
          f"ceilings ({limits['source']}): {ceilings.summary(limits)}", flush=True)
    if args.flush_check:
        flush_check.run(out_dir)
        report.update_docs()
        return 0
    if args.overhead:
        from .run import overhead

        print(overhead.run(torch.Generator(device="cuda").manual_seed(0), env, out_dir))
        return 0

    if args.backend in (None, "cuda") and any(rosetta.variants(op, "cuda") for op in ops):
        t0 = time.monotonic()
        from rosetta import cuda_build

        cuda_build.load()
        print(f"CUDA extension ready in {time.monotonic() - t0:.1f} s", flush=True)

    if args.suite:
        from .run import shape_suite

        dtypes = [getattr(torch, d) for d in args.dtype] if args.dtype else None
        rows = shape_suite.run(ops, torch.Generator(device="cuda").manual_seed(0), limits,
                               timing.Flush("read"), env, out_dir, dtypes,
                               args.backend if args.backend in rosetta.BACKENDS else None)
        failed = sorted({r["label"] for r in rows if r["backend"] in rosetta.BACKENDS
                         and (r["status"] == "wrong" or r["status"].startswith("error"))})
        from rosetta import dispatch_table

        from .docs import suite_report

        every = results.read_rows(out_dir / "suite.csv")  # this run's cases and the kept ones
        suite_report.write(out_dir, every)
        print(suite_report.summary_table(every, dispatch_table.read(out_dir / dispatch_table.TABLE_NAME)))
        print(f"suite: {len(rows)} rows in {time.monotonic() - start:.0f} s" + (f"; FAILED: {failed}" if failed else ""))
        return 1 if failed else 0

    groups = suite.plan(ops, args.quick)
    per_group = {g: [s for s in suite.subjects(g.op, args.backend, args.step, g.role, g.dtype, g.shape)
                     if suite.takes(s, g)]
                 for g in groups}
    progress = suite.Progress(sum(len(subs) * len(g.layouts) for g, subs in per_group.items()))
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    flush = timing.Flush("read")
    rows = []
    csv_path = out_dir / ("bench-quick.csv" if args.quick else "bench.csv")
    full = not (args.backend or args.step or args.op or args.quick)
    for group, subs in per_group.items():
        fresh = suite.run_group(group, subs, gen, limits, flush, progress, env["git_sha"])
        rows += fresh
        results.write_rows(csv_path, fresh, replace_all=False)  # an interrupted run keeps what it measured
        torch.cuda.empty_cache()
    if args.op and not (args.backend or args.step or args.quick):
        # whole ops re-measured: their earlier rows go (a sweep whose best step changed would
        # otherwise keep the old best step's points beside the new one's)
        others = [r for r in results.read_rows(csv_path) if r["op"] not in args.op]
        results.write_rows(csv_path, others + rows, replace_all=True)
    else:
        results.write_rows(csv_path, rows, replace_all=full)
    env.update(timing_method=suite.TIMING_METHOD, ceiling_source=limits["source"],
               bench_wall_s=round(time.monotonic() - start, 1))
    # keep what `make profile` recorded (its own git sha, ncu version, wall time)
    previous = results.read_environment(out_dir / "environment.json")
    results.write_environment(out_dir / "environment.json",
                              {**{k: v for k, v in previous.items() if k.startswith(("profile_", "ncu"))}, **env})
    if not args.quick:
        from .run import shape_suite

        shape_suite.write_table(out_dir, env)  # ops without a suite: step=None from these headlines
        report.regenerate()  # plots (with the roofline) and the README/KERNEL_LOG tables
    for op in ops:
        print("\n" + tables.all_ladder_tables(rows, op, level="###"))
    # A declared refusal or a slow step timed at smaller shapes is expected; a wrong answer or an
    # error is not. Only our own steps fail the run: a peer library's wrong answer is reported.
    failed = {r["label"] for r in rows if r["status"] == "wrong" or r["status"].startswith("error")}
    ours = sorted(label for label in failed if label.split("/")[1] in rosetta.BACKENDS)
    peers = sorted(failed - set(ours))
    print(f"wrote {csv_path.relative_to(rosetta.registry.REPO)} ({len(rows)} rows) in "
          f"{time.monotonic() - start:.0f} s" + (f"; FAILED: {ours}" if ours else "")
          + (f"; peers wrong or failing (reported, not ours): {peers}" if peers else ""))
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
