"""What every Triton step shares: the interpreter switch and the machine's size.

Under TRITON_INTERPRET=1 the grid runs program by program on the CPU and nothing can be
benchmarked, so an autotuned step gets one configuration there (`tuned`)."""
import functools
import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


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
