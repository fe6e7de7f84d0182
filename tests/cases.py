"""Test shapes per op, each chosen to break something (the comment says what)."""
import torch

from rosetta.ops import SPECS

# Small enough for the Triton interpreter, which runs the grid one program at a time on the CPU.
CPU_SHAPES = {
    "vector_add": [
        (1,),  # a single element: every lane but one masked off
        (17,),  # a prime below one block/vector: only the masked tail
        (1000003,),  # a prime over many blocks: the last block partial, n % 8 != 0
    ],
}

# On the GPU: every step x dtype x these shapes against fp64.
GPU_SHAPES = {
    "vector_add": [
        (1,),  # one element, one partial vector
        (17,),  # prime: scalar tail only, no full 16-byte vector for fp16/bf16 (8 per vector)
        (4097,),  # 2^12 + 1: one element past a block/vector boundary
        (2**20 + 3,),  # a full grid-stride sweep plus a 3-element tail
        (2**28,),  # 1 GiB of fp32: far past the 50 MiB L2, the bench's headline size
    ],
}

# >= 2^31 elements (64-bit offsets); 16-bit dtypes keep each tensor at 4 GiB.
HUGE_NUMEL = 2**31 + 17


def make_inputs(op, shape, dtype, device, gen, contiguous=True):
    """Fresh random inputs; non-contiguous ones view every other element of a wider tensor."""
    spec = SPECS[op]
    if contiguous:
        return spec.make_inputs(shape, dtype, device, gen)
    wide = (*shape[:-1], 2 * shape[-1])
    return tuple(t[..., ::2] for t in spec.make_inputs(wide, dtype, device, gen))
