"""What compute-sanitizer runs: every step of one op/backend, once per direction x dtype x small shape.

    python -m rosetta.bench.sanitize.driver --op softmax --backend cuda [--step 3] [--shapes 4]

Before each step's launches it prints `ROSETTA-STEP <label> <direction> <dtype> <shape>` and
flushes, then synchronizes after the step: whatever the sanitizer prints between two markers
belongs to the step of the first (bench/sanitize/report.py reads them). Input creation runs under
`ROSETTA-INPUTS` (errors there belong to "(setup)"), a step that declares a limit the shape breaks
prints `ROSETTA-SKIP`, a Python exception `ROSETTA-EXCEPTION`, and a clean end `ROSETTA-DONE`.

    python -m rosetta.bench.sanitize.driver --selfcheck

runs a planted fault instead: a Triton load with its mask left off (reads 16 elements past a
512-byte tensor), then the same kernel masked. Under memcheck the first must have errors and the second
none: that shows both that the tool sees faults here and that the markers attribute them.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "0")

MAX_NUMEL = 2**20  # memcheck/racecheck run kernels 10-100x slower: small shapes only


def numel(spec, shape) -> int:
    """Elements of a case's inputs (matmul (M, K, N): M*K + K*N; the larger direction), counted
    on the meta device."""
    import torch

    try:
        return max(sum(t.numel() for t in d.make_inputs(shape, torch.float32, "meta", None))
                   for d in spec.directions().values())
    except Exception:
        return math.prod(shape)


def small_shapes(spec) -> list[tuple]:
    """The op's tiling-breaking test shapes that are non-empty and small, in the spec's order."""
    return [s for s in spec.test_shapes if math.prod(s) > 0 and numel(spec, s) <= MAX_NUMEL]


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def shape_name(shape) -> str:
    return "x".join(map(str, shape))


def say(*words) -> None:
    print(*words, flush=True)


def run_once_autotuning() -> None:
    """The autotuner times every config with triton.testing.do_bench (hundreds of launches each,
    each instrumented). Under the sanitizer the choice does not matter, only that every config
    runs: replace the timing by one launch + sync. Every config is still launched (and checked);
    the first one then serves the call. get_benchmarker() imports do_bench at call time."""
    try:
        import torch
        import triton.testing

        def once(fn, *args, quantiles=None, **kwargs):
            fn()
            torch.cuda.synchronize()
            return [1.0, 1.0, 1.0] if quantiles else 1.0

        triton.testing.do_bench = once
    except Exception as err:  # an older/newer Triton: autotune then times as usual (slower)
        say(f"ROSETTA-NOTE autotune timing left as is: {err!r}")


def selfcheck() -> int:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(x_ptr, out_ptr, n, START: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr):
        offs = START + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0) if MASKED else tl.load(x_ptr + offs)  # planted: no mask
        tl.store(out_ptr + tl.arange(0, BLOCK), x)

    # 512 bytes: the allocator's rounding unit, so the allocation ends exactly where x does and the
    # 16 unmasked reads past it land in memcheck's padding (a 1-element x would be rounded up to a
    # 512-byte block, and reads just past the element would be invisible to memcheck).
    n = 128
    x = torch.ones(n, device="cuda")
    out = torch.zeros(32, device="cuda")
    for name, masked in (("selfcheck/triton/01_planted_oob", False), ("selfcheck/triton/02_masked", True)):
        say(f"ROSETTA-STEP {name} forward float32 {n}")
        # reads x[112:144]: 16 of them out of bounds, fewer than --print-limit, so the masked run stays visible
        copy_kernel[(1,)](x, out, n, START=n - 16, BLOCK=32, MASKED=masked, num_warps=1)
        torch.cuda.synchronize()
    say("ROSETTA-DONE")
    return 0


class Aborted(Exception):
    """A step left the CUDA context unusable: every later step would fail."""


def run_case(torch, v, direction: str, d, dtype, shape, gen) -> bool:
    """One step on one case behind its markers; False when the step refused it (a declared limit)."""
    case = f"{v.label} {direction} {dtype_name(dtype)} {shape_name(shape)}"
    say(f"ROSETTA-INPUTS {case}")
    inputs = d.make_inputs(shape, dtype, "cuda", gen)
    torch.cuda.synchronize()
    say(f"ROSETTA-STEP {case}")
    try:
        out = v(*inputs) if direction == "forward" else v.backward(*inputs)
        torch.cuda.synchronize()
        del out
        return True
    except ValueError as err:  # checked before any launch: a `Max:`/layout limit, not a finding
        say(f"ROSETTA-SKIP {case} {first_line(err)}")
        return False
    except Exception as err:
        say(f"ROSETTA-EXCEPTION {case} {type(err).__name__}: {first_line(err)}")
        try:
            torch.cuda.synchronize()
        except Exception:
            say(f"ROSETTA-ABORT {case} the CUDA context is unusable")
            raise Aborted from err
        return True


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op")
    parser.add_argument("--backend", choices=("cuda", "triton"))
    parser.add_argument("--step", type=int, default=None, help="one step only (default: all)")
    parser.add_argument("--shapes", type=int, default=4, help="how many small test shapes")
    parser.add_argument("--selfcheck", action="store_true", help="a planted fault, nothing else")
    args = parser.parse_args(argv)
    if args.selfcheck:
        return selfcheck()
    if not (args.op and args.backend):
        parser.error("--op and --backend are required (or --selfcheck)")

    run_once_autotuning()
    import torch

    import rosetta
    from rosetta.ops import SPECS

    spec = SPECS[args.op]
    small = small_shapes(spec)
    chosen, spare = small[:args.shapes], small[args.shapes:]
    gen = torch.Generator(device="cuda").manual_seed(0)
    ladder = [v for v in rosetta.variants(args.op, args.backend) if args.step in (None, v.step)]
    say(f"ROSETTA-PLAN {args.op} {args.backend} steps={len(ladder)} "
        f"shapes={','.join(map(shape_name, chosen))} spare={','.join(map(shape_name, spare))}")
    try:
        for v in ladder:
            for direction, d in spec.directions().items():
                for dtype in v.dtypes:
                    taken = [run_case(torch, v, direction, d, dtype, shape, gen) for shape in chosen]
                    # a step that refused every chosen shape (e.g. TMA wants K, N multiples of 8)
                    # gets the first spare small shape it takes, so it is checked at all
                    for shape in spare if not any(taken) else ():
                        if run_case(torch, v, direction, d, dtype, shape, gen):
                            break
    except Aborted:
        return 3
    say("ROSETTA-DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
