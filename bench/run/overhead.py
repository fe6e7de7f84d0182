"""Host cost per call (`python -m rosetta.bench --overhead`): what a public call costs the CPU on a
tiny input, beside torch's own call, and each layer under it.

Each call is made CALLS times in a loop with no synchronisation and timed by the host clock, in
ROUNDS rounds, every layer of every case once a round in turns (torch's calls among them), and the
median round's mean is reported (single loops on the H100's host moved by up to a factor of three
from run to run with garbage collections and other processes, and timed one layer after another,
each layer saw its own part of the host's drift: a plain call could come out slower than the same
call with requires_grad; all cases in one set of turns and case by case measured within 0-7% of
each other in one process). All of it runs twice and the first pass is thrown away: in a fresh
process the first pass ran 1.3-1.6x slower than the next on the H100's host, every layer alike
(torch's softmax call 11.0-11.5 us, then 7.3-7.5). The input is tiny, so the GPU finishes each kernel before the next launch arrives and the
loop measures the host path alone. Layers, from the outside in: the public call (rosetta.<op>, step=None: the
cached signature, allocation, the kernel launch; for a Triton step, its recorded launches replayed), the same with requires_grad inputs (an
autograd.Function around the same kernels), the registered torch op (what torch.compile traces:
step choice, checks, custom-op dispatch), the step choice alone (registry.select) and the raw
kernel launch into a preallocated output (what the bench's graphs capture).
"""
from __future__ import annotations

import torch

import rosetta
from rosetta import calls, registry, timing
from rosetta.ops import SPECS

from .. import results

CALLS = 500
ROUNDS = 7  # the median round is reported
CASES = (("softmax", (8, 1000), torch.float32), ("matmul", (64, 64, 64), torch.bfloat16),
         ("vector_add", (1000,), torch.float32), ("reduce_sum", (1000,), torch.float32))


def host_us_in_turns(fns: list, calls_: int = CALLS, rounds: int = ROUNDS) -> list[float]:
    """Each fn's host time per call (us) after 20 warm-up calls: `rounds` rounds of `calls_` calls,
    in turns, the median round (timing.host_in_turns)."""
    for fn in fns:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    return [s * 1e6 for s in timing.host_in_turns(fns, [calls_] * len(fns), rounds)]


def layers(op: str, shape, dtype, gen) -> list[tuple[str, str, object]]:
    """(backend, layer, call) for torch's call and every layer of each backend's public call."""
    d = SPECS[op].forward
    inputs = d.make_inputs(shape, dtype, "cuda", gen)
    public = getattr(rosetta, op)
    found = [("torch", "call", lambda: d.torch_expr(*inputs))]
    grad_inputs = tuple(t.detach().requires_grad_() for t in inputs) if SPECS[op].autograd else None
    if grad_inputs:
        found.append(("torch", "call, requires_grad", lambda: d.torch_expr(*grad_inputs)))
    for backend in rosetta.BACKENDS:
        v = rosetta.best(op, backend, dtype, inputs)
        launch, _ = v.launcher("forward", inputs, d.allocate(*inputs))
        found.append((backend, f"call (step {v.step})", lambda b=backend: public(*inputs, backend=b)))
        if grad_inputs:
            found.append((backend, "call, requires_grad", lambda b=backend: public(*grad_inputs, backend=b)))
        found += [(backend, "registered torch op", lambda b=backend: calls.registered_call(op, b, None, inputs)),
                  (backend, "step choice (select)", lambda b=backend: registry.select(op, b, None, dtype, inputs)),
                  (backend, "raw launch", launch)]
    return found


def run(gen, env: dict, out_dir) -> str:
    rows, lines = [], ["| op | input | backend | layer | host us per call |", "|---|---|---|---|--:|"]
    subjects = []  # (op, input, backend, layer, call): every case's layers, timed together in turns
    for op, shape, dtype in CASES:
        if op not in rosetta.ops_with_steps():
            continue
        what = f"{str(dtype).removeprefix('torch.')} {'x'.join(map(str, shape))}"
        subjects += [(op, shape, dtype, what, backend, layer, fn) for backend, layer, fn in layers(op, shape, dtype, gen)]
    fns = [s[-1] for s in subjects]
    host_us_in_turns(fns)  # the first pass, thrown away (the module's docstring says why)
    times = host_us_in_turns(fns)
    for (op, shape, dtype, what, backend, layer, _), us in zip(subjects, times):
        print(f"{op:10s} {what:16s} {backend:7s} {layer:28s} {us:8.1f} us", flush=True)
        lines.append(f"| {op} | {what} | {backend} | {layer} | {us:.1f} |")
        row = dict.fromkeys(results.COLUMNS)
        row.update(op=op, direction="forward", backend=backend, name=layer, label=f"{op}/{backend}/{layer}",
                   dtype=str(dtype).removeprefix("torch."), shape="x".join(map(str, shape)), role="overhead",
                   layout="", status="ok", p50_ms=us / 1e3,
                   timing=f"host clock, median of {ROUNDS} rounds of {CALLS} calls, every layer of every case in turns, no sync",
                   git_sha=env["git_sha"])
        rows.append(row)
    results.write_rows(out_dir / "overhead.csv", rows, replace_all=True)
    table = "\n".join(lines)
    (out_dir / "overhead.md").write_text(
        "# Host cost per call\n\nGenerated by `python -m rosetta.bench --overhead` (bench/run/overhead.py says "
        f"how): the median of {ROUNDS} rounds of {CALLS} calls on a tiny input, every layer of every case in turns, no synchronisation, host clock; run {env['git_sha']} on "
        f"{env['gpu']}. The host's speed moves from run to run, torch's own calls with it: compare a layer with "
        f"torch's call in the same run.\n\n{table}\n")
    return table
