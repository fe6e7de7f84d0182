"""Test shapes per op, each chosen to break something (the comment says what)."""

from rosetta.ops import SPECS

# Small enough for the Triton interpreter, which runs the grid one program at a time on the CPU.
CPU_SHAPES = {
    "vector_add": [
        (1,),  # a single element: every lane but one masked off
        (17,),  # a prime below one block/vector: only the masked tail
        (1000003,),  # a prime over many blocks: the last block partial, n % 8 != 0
    ],
    "reduce_sum": [
        (0,),  # the empty sum: 0.0, and no launch with a zero-sized grid
        (1,),  # one element: every tree level but the first is padding
        (31,),  # under one warp, not a power of two
        (1025,),  # one past a 1024 block: a second program with a single element
        (100003,),  # prime, many programs, a ragged last block
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
    "reduce_sum": [
        (0,),  # empty: 0.0 without launching an empty grid
        (1,),  # a single element through every pass
        (31,),  # less than a warp: shuffles with missing lanes
        (1025,),  # 2 x 512 + 1: one extra block holding one element
        (2**20 + 7,),  # many blocks, n % 8 != 0: the vector tail, a multi-pass partial count
        (2**28,),  # 1 GiB fp32, the headline size: grid-stride loops run many iterations
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
