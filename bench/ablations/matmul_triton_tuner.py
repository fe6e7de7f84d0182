"""Triton split-K at small and mid-size M: does the autotuner pick the tile the bench would?

Triton's autotuner times each config with triton.testing.do_bench, which flushes L2 by zeroing a
256 MB buffer: ~50 MB of dirty lines whose write-back then runs inside the timed kernel
(rosetta.timing says why the bench reads a buffer instead). At the 10-50 us kernels of steps 7
and 9 that could reorder the configs. Here, per shape and step, every config the tuner may pick
(split_k.tiles_fitting_m of its list) runs alone (the step's launch with its tuner's list set to
that config; the split rule applied to it), timed three ways: do_bench as the tuner calls it (d),
events after the bench's clean flush (c), and the bench's own method, all configs in turns (t:
CUDA-graph replays, L2 flushed, median; rosetta.timing.measure_in_turns). The line says which
config each of d and c would pick, and its time by t. On a GPU box, from the repository root:
python bench/ablations/matmul_triton_tuner.py
"""
import torch
import triton.testing

from rosetta import registry, timing, torch_ops
from rosetta.bench import environment
from rosetta.timing import Flush, measure_in_turns
from rosetta.triton_kernels.split_k import tiles_fitting_m

SHAPES = ((256, 4096, 4096), (128, 4096, 4096), (128, 768, 3072), (256, 768, 3072), (1, 4096, 4096),
          (64, 16384, 64), (300, 8192, 300), (16, 4096, 14336))  # M x K x N, bf16
KERNELS = {7: "matmul_split_k_half", 9: "matmul_fixup_half"}


def name(c) -> str:
    k = c.kwargs
    return f"m{k['BLOCK_M']}n{k['BLOCK_N']}k{k['BLOCK_K']}w{c.num_warps}s{c.num_stages}"


def forced(kernel, config, launch):
    """The step's launch with its tuner's list set to `config` alone during the call."""
    def run():
        kept = kernel.configs
        kernel.configs = [config]
        try:
            launch()
        finally:
            kernel.configs = kept
    return run


def main():
    flush = Flush("read")
    for M, K, N in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        for step, attr in KERNELS.items():
            v = registry.select("matmul", "triton", step, a.dtype, (a, b))
            kernel = getattr(torch_ops.triton_module(v), attr)
            configs = tiles_fitting_m(kernel.configs, {"M": M})
            fns = []
            for c in configs:
                out = torch.empty(M, N, device="cuda", dtype=a.dtype)
                fns.append(forced(kernel, c, v.launcher("forward", (a, b), out)[0]))
                fns[-1]()
            torch.cuda.synchronize()
            names = [name(c) for c in configs]
            tuner = [triton.testing.do_bench(f, quantiles=(0.5, 0.2, 0.8))[0] * 1e3 for f in fns]
            clean = [timing.time_calls(f, flush)["p50_ms"] * 1e3 for f in fns]
            truth = [r["p50_ms"] * 1e3 for r in measure_in_turns([[f] for f in fns], flush)]
            i_d, i_c, i_t = (min(range(len(fns)), key=x.__getitem__) for x in (tuner, clean, truth))
            print(f"{M}x{K}x{N} step{step}: do_bench picks {names[i_d]} (t {truth[i_d]:.1f}), clean picks "
                  f"{names[i_c]} (t {truth[i_c]:.1f}), best {names[i_t]} {truth[i_t]:.1f}", flush=True)
            print("   " + "  ".join(f"{n} d{d:.1f}/c{c:.1f}/t{t:.1f}" for n, d, c, t in
                                    sorted(zip(names, tuner, clean, truth), key=lambda r: r[3])), flush=True)


if __name__ == "__main__":
    env = environment.collect()
    print("# Triton split-K: the tuner's pick against the bench's timing (bench/ablations/matmul_triton_tuner.py)")
    print(f"# {env['gpu']}, driver {env['driver']}, CUDA {env['cuda_runtime']}, torch {env['torch']}, "
          f"triton {env['triton']}, git {env['git_sha']}, {env['date_utc'][:10]}")
    print("# times in us: d = triton do_bench (zeroing flush, as the autotuner), c = events after a clean flush, "
          "t = the bench's method, all configs in turns")
    main()
