"""Triton streaming probes: an elementwise add (2 reads + 1 write) and a copy, autotuned over block
size and warps. They are here because on the H100 the autotuned Triton vector_add step beat
torch.add by 1-2% (add: 3,117 GB/s vs 3,060 in one survey): a ceiling must include the best kind
of kernel the bench times, or steps pass 100% of it."""
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK": block}, num_warps=warps)
           for block in (1024, 2048, 4096, 8192, 16384) for warps in (4, 8, 16)]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


def add(x, y, out):
    n = out.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)


def copy(x, out):
    n = out.numel()
    copy_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)


@triton.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out_ptr"])
@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # one BLOCK-wide load per program and one atomic: the read pattern of the Triton reduce_sum
    # step that out-read every other probe on the H100
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0), axis=0))


def total(x, out):
    """out (a zeroed fp32 scalar) += sum(x): a read-only probe."""
    n = x.numel()
    sum_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
