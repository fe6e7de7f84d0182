"""What every Triton step shares: the interpreter switch and the machine's size.

Under TRITON_INTERPRET=1 the grid runs program by program on the CPU and nothing can be
benchmarked, so an autotuned step gets one configuration there (`tuned`)."""
import functools
import os

import torch
import triton
import triton.language as tl
import triton.testing

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# Host-side integer helpers for grids and launch arguments. triton.cdiv and triton.next_power_of_2
# are ConstexprFunctions (callable inside kernels too), and on the host each call costs ~1.5 us of
# wrapping: a launch that asks for a few of them pays more in arithmetic than in the launch itself.
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, as triton.cdiv."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1), as triton.next_power_of_2."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def quick_bench(kernel_call, quantiles):
    """The autotuner's timing of one config for kernels of a millisecond or more (attention): 5 ms of
    warm-up and 40 of repetitions instead of Triton's 25 and 100. Each repetition still flushes L2;
    the configs it ranks differ by more than the spread of a few runs, and the bench, which times
    every autotuned step at ~10 shapes x 2 directions x 10-30 configs, gets its minutes back."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=40, quantiles=quantiles)


def tuned(configs: list, interpret_config):
    """The autotuner's configs on a GPU; the single `interpret_config` under the interpreter."""
    return [interpret_config] if INTERPRET else configs


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (1 on the CPU): persistent grids are sized to it."""
    if device.type != "cuda":
        return 1
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_sm_count(index: int) -> int:  # asked on every launch: the properties call costs microseconds
    return torch.cuda.get_device_properties(index).multi_processor_count


@triton.jit
def wait_for_peers(counter_ptr, peers):
    """Announce this program's partials (stored just before), then spin until `peers` programs have
    announced on the same counter (an int32, zeroed before the launch): the programs that share a
    row meet through L2, which is how a Triton step stands in for a CUDA cluster's DSMEM. Read the
    peers' partials after this with cache_modifier=".cg" (from L2, never a stale L1 line). Every
    peer must be resident at once: under TRITON_INTERPRET=1 programs run one after another, so
    there `peers` must be 1."""
    tl.debug_barrier()  # every thread's partial store is ordered before the release below
    tl.atomic_add(counter_ptr, 1, sem="release")
    while tl.atomic_add(counter_ptr, 0, sem="acquire") < peers:
        pass
