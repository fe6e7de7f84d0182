"""The flush comparison README shows under "how it measures": memory-bound kernels timed after
do_bench's zeroing flush, after our read-only flush, and back to back on rotating inputs with no
flush at all. The zeroing flush bills the next kernel for writing back its dirty lines."""
from __future__ import annotations

import torch

from rosetta import timing

from .. import results

CASES = (  # (name, make inputs + the call, bytes moved)
    ("torch.sum fp32 2^28", lambda x: (lambda: torch.sum(x, dim=0)), (2**28,), 4 * 2**28),
    ("torch.softmax fp32 4096x1024", lambda x: (lambda: torch.softmax(x, -1)), (4096, 1024), 2 * 4 * 2**22),
    ("copy fp32 2^28 (into a preallocated output)", lambda x: (lambda out=torch.empty_like(x): out.copy_(x)),
     (2**28,), 2 * 4 * 2**28),
)


def run(out_dir) -> list[dict]:
    rows = []
    flushes = {mode: timing.Flush(mode) for mode in timing.FLUSH_MODES}
    for name, make, shape, nbytes in CASES:
        inputs = [torch.randn(shape, device="cuda") for _ in range(8)]
        fn = make(inputs[0])
        for label, t in (("zeroing flush (do_bench's)", timing.measure(fn, flushes["zero"])),
                         ("read-only flush (ours)", timing.measure(fn, flushes["read"])),
                         ("sustained, 64 calls on 8 rotating inputs", timing.sustained(lambda i: make(inputs[i])))):
            rows.append({"kernel": name, "method": label, "p50_us": t["p50_ms"] * 1e3,
                         "gbps": nbytes / (t["p50_ms"] * 1e-3) / 1e9})
            print(f"{name:30s} {label:42s} {t['p50_ms'] * 1e3:8.1f} us {rows[-1]['gbps']:7.0f} GB/s", flush=True)
        del inputs
        torch.cuda.empty_cache()
    write(out_dir, rows)
    return rows


def write(out_dir, rows) -> None:
    import csv

    with (out_dir / "flush.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: (f"{v:.1f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
    env = results.read_environment(out_dir / "environment.json")
    lines = [f"Measured on {env.get('gpu', 'the GPU')} by `python -m rosetta.bench --flush-check` "
             "(median of CUDA-graph replays):", "",
             "| kernel | timing | time (us) | GB/s |", "|---|---|--:|--:|"]
    lines += [f"| {r['kernel']} | {r['method']} | {r['p50_us']:.1f} | {r['gbps']:.0f} |" for r in rows]
    (out_dir / "flush.md").write_text("\n".join(lines) + "\n")
