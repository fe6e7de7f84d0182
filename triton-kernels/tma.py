"""Host-side rules and set-up for Triton steps that load through TMA (Hopper's bulk tensor copy
engine): shared by the matmul steps that use device-side tensor descriptors."""
import torch
import triton

from rosetta.ops.matmul import address


def check_tma(step, a, b, out):
    """TMA's rules for a global tensor: 16-byte aligned base, unit last stride, row stride a
    multiple of 16 bytes. Raised before any launch; step 4 takes any strides."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or address(t) % 16:
            raise ValueError(
                f"matmul step {step} loads through TMA and needs {name} with a 16-byte aligned base, "
                f"unit column stride and a row stride that is a multiple of 16 bytes (for 16-bit "
                f"types: K and N multiples of 8); got {name} of shape {tuple(t.shape)}, strides "
                f"{t.stride()}, address % 16 = {address(t) % 16}. Step 4 takes any strides.")


def set_descriptor_allocator(device):
    """Device-side descriptors need 128 bytes of global scratch per program, allocated by Triton
    at launch through this hook; torch's caching allocator makes it stream-ordered and cheap."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device=device, dtype=torch.int8))
