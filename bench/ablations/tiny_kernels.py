"""How far apart two timings of the same tiny kernel land: the suite's smallest cases.

The shape suite's worst softmax and vector_add ratios are its tiniest cases (softmax fp32 1 x 128,
vector_add fp32 1,024 elements: 0.80-0.86x torch), where every kernel takes 4-6 us, mostly the
launch and the events around it. Here the same calls are timed in turns twice, with two orders
(seeds) of the rounds and new graphs each time, beside torch's calls and an allocation-only graph.
On a GPU box, from the repository root: python bench/ablations/tiny_kernels.py
"""
import torch

import rosetta
from rosetta.timing import Flush, measure_in_turns


def main():
    flush = Flush("read")
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 128, device="cuda", dtype=dt)
        a, b = torch.randn(1024, device="cuda", dtype=dt), torch.randn(1024, device="cuda", dtype=dt)
        out = torch.empty_like(a)
        subjects = {"sm_torch": lambda: torch.softmax(x, -1), "sm_torch_out": lambda: torch._softmax(x, -1, False),
                    "sm_c5": lambda: rosetta.softmax(x, backend="cuda", step=5),
                    "sm_c2": lambda: rosetta.softmax(x, backend="cuda", step=2),
                    "sm_t1": lambda: rosetta.softmax(x, backend="triton", step=1),
                    "va_torch": lambda: torch.add(a, b), "va_torch_out": lambda: torch.add(a, b, out=out),
                    "va_c1": lambda: rosetta.vector_add(a, b, backend="cuda", step=1),
                    "va_t1": lambda: rosetta.vector_add(a, b, backend="triton", step=1),
                    "empty": lambda: torch.empty_like(a)}
        for seed in (0, 1):
            res = measure_in_turns([[f] for f in subjects.values()], flush, seed=seed)
            print(str(dt)[6:], "seed", seed, "  ".join(f"{n} {r['p50_ms'] * 1e3:.2f}" for n, r in zip(subjects, res)),
                  flush=True)


if __name__ == "__main__":
    main()
