"""Host-side rules and set-up for Triton steps that load through TMA (Hopper's bulk tensor copy
engine): shared by the matmul steps that use device-side tensor descriptors."""
import torch
import triton

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
