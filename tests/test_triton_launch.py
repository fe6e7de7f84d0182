"""The eager Triton launch cache's key (rosetta.triton_launch): it must separate every launch that
Triton would compile or tune differently, and refuse what it cannot key. Runs on the CPU: the key
needs no GPU (the launches themselves are tested in test_gpu.py)."""
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from rosetta.triton_launch import Launcher


def body(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr, EVEN: tl.constexpr = True):
    pass


KERNEL = Launcher(JITFunction(body))


def key(*args, **kwargs):
    return KERNEL.key(args, kwargs)


def test_constexprs_are_keyed_by_value():
    x = torch.empty(64)
    assert key(x, x, 100, 7, 64) != key(x, x, 100, 7, 128)
    assert key(x, x, 100, 7, 64, EVEN=True) != key(x, x, 100, 7, 64, EVEN=False)


def test_ints_by_what_triton_specializes():
    x = torch.empty(64)
    assert key(x, x, 100, 7, 64) == key(x, x, 101, 9, 64)  # neither 1 nor a multiple of 16
    assert key(x, x, 32, 7, 64) != key(x, x, 33, 7, 64)  # divisible by 16 or not
    assert key(x, x, 1, 7, 64) != key(x, x, 3, 7, 64)  # 1 is its own case
    assert key(x, x, 2**31 + 3, 7, 64) != key(x, x, 3, 7, 64)  # 64-bit


def test_tensors_by_dtype_and_alignment():
    x = torch.empty(64)
    assert key(x, x, 3, 7, 64) != key(x, x.half(), 3, 7, 64)
    assert key(x, x, 3, 7, 64) != key(x, x[1:], 3, 7, 64)  # 4 bytes off a 16-byte boundary


def test_what_it_cannot_key_takes_tritons_path():
    x = torch.empty(64)
    assert key(x, (x, x), 3, 7, 64) is None


def test_autotuner_keys_by_its_exact_key_values():
    tuned = Launcher(triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])(JITFunction(body)))
    x = torch.empty(64)
    assert tuned.key((x, x, 100, 7), {}) != tuned.key((x, x, 101, 7), {})
