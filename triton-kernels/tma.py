"""What the Triton matmul steps that load through TMA (Hopper's bulk tensor copy engine) share:
the host-side rules and set-up, and the device-side pieces of their persistent tile loops (the
grouped tile order, the operand descriptors and the operand loads)."""
import torch
import triton
import triton.language as tl

from rosetta.ops.matmul import address, is_column_major


def check_tma(step, a, b, out, columns=False):
    """TMA's rules for a global tensor: 16-byte aligned base, unit last stride, leading stride a
    multiple of 16 bytes. `columns`: a and b may also be column-major (the unit stride first).
    Raised before any launch; step 4 takes any strides."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        lead = 1 if columns and name != "out" and is_column_major(t) else 0
        if t.stride(1 - lead) != 1 or (t.stride(lead) * t.element_size()) % 16 or address(t) % 16:
            layout = "row- or column-major" if columns and name != "out" else "a unit column stride"
            raise ValueError(
                f"matmul step {step} loads through TMA and needs {name} with a 16-byte aligned base, "
                f"{layout} and a leading stride that is a multiple of 16 bytes (for 16-bit "
                f"types: K and N multiples of 8); got {name} of shape {tuple(t.shape)}, strides "
                f"{t.stride()}, address % 16 = {address(t) % 16}. Step 4 takes any strides.")


def set_descriptor_allocator(device):
    """Device-side descriptors need 128 bytes of global scratch per program, allocated by Triton
    at launch through this hook; torch's caching allocator makes it stream-ordered and cheap."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device=device, dtype=torch.int8))


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Step 3's grouped order: GROUP_M row blocks, down the rows first, then across."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % num_pid_in_group) % group_size_m
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def operand_descriptors(a_ptr, b_ptr, M, N, K, lda, ldb, A_COLS: tl.constexpr, B_COLS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """TMA descriptors of A (M x K) and B (K x N), each described as it lies in memory: the box's
    last dimension is the unit-stride one, so a column-major operand (A_COLS / B_COLS) is the
    row-major transpose, loaded transposed by `load_operands`. Built on the device into a
    128-byte global scratch (set_descriptor_allocator); TMA coordinates are per-dimension element
    indices, so no 64-bit offset arithmetic is needed."""
    if A_COLS:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[lda, 1], block_shape=[BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[lda, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_COLS:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[ldb, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[ldb, 1], block_shape=[BLOCK_K, BLOCK_N])
    return a_desc, b_desc


@triton.jit
def load_operands(a_desc, b_desc, ki, off_m, off_n, A_COLS: tl.constexpr, B_COLS: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """The K-slice ki of A's BLOCK_M rows at off_m and B's BLOCK_N columns at off_n, oriented for
    tl.dot. Rows past M, columns past N and k past K arrive as zeros (TMA's out-of-bounds fill).
    A transposed operand is flipped with .T: wgmma reads either major-ness of 16-bit operands
    from shared memory, so no shuffle is compiled."""
    if A_COLS:
        a = a_desc.load([ki * BLOCK_K, off_m]).T
    else:
        a = a_desc.load([off_m, ki * BLOCK_K])
    if B_COLS:
        b = b_desc.load([off_n, ki * BLOCK_K]).T
    else:
        b = b_desc.load([ki * BLOCK_K, off_n])
    return a, b
