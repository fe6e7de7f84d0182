"""The vector widths two Triton steps claim, proved from the PTX of an ahead-of-time compile for
GPUTarget("cuda", 90, 32), no GPU needed: vector_add step 3 and softmax step 5 exist because
Triton emits 16-byte accesses only where it can prove alignment, and a bf16 row or size that is
not a multiple of 16 elements loses the proof.

Each kernel is compiled as a launch would specialize it: pointers divisible by 16 (torch's
allocations), and an integer divisible by 16 only where the case says so. Counted in the PTX:
ld/st.global.v4.b32 (16 bytes) and ld/st.global.b16 (one bf16 element). The compile runs in a
child process without TRITON_INTERPRET, as in test_triton_ir.py."""
import re

import pytest
from helpers import sm90_child, sm90_main

SPLIT = dict(BLOCK=8192, ROWS=1, SPLIT=True, ONE_TILE=True, CHUNKS_P2=8)
WINDOW = dict(SPLIT, V=8, WINDOW=True, EDGE_LANES=256)
# (name, op, step, kernel, constexprs, integer arguments the launch specializes as divisible by 16)
CASES = (
    ("add step 2, n % 16 != 0", "vector_add", 2, "add_kernel", dict(BLOCK=4096), ()),
    ("add step 3, n % 16 != 0", "vector_add", 3, "add_kernel", dict(BLOCK=4096), ()),
    ("softmax step 4, 50257 columns", "softmax", 4, "softmax_split_kernel", SPLIT, ("chunk_len",)),
    ("softmax step 5, 50257 columns", "softmax", 5, "softmax_window_kernel", dict(WINDOW, EDGES=True),
     ("chunk_len", "mis")),
    ("softmax step 5, 4096 columns", "softmax", 5, "softmax_window_kernel", dict(WINDOW, EDGES=False),
     ("chunk_len", "mis", "cols", "x_row_stride")),
)


def accesses(ptx: str) -> dict:
    """How many 16-byte and 2-byte global loads and stores the PTX has."""
    return {kind: len(re.findall(rf"\b{kind}\b", ptx)) for kind in
            ("ld.global.v4.b32", "st.global.v4.b32", "ld.global.b16", "st.global.b16")}


def compile_case(op, step, kernel, consts, divisible):
    """(child) The step's kernel, loaded as the bindings load it, compiled for sm_90 in bf16."""
    import triton
    from triton.backends.compiler import GPUTarget
    import rosetta
    from rosetta.torch_ops import triton_module

    fn = getattr(triton_module(next(v for v in rosetta.variants(op=op, backend="triton") if v.step == step)), kernel)
    fn = fn if isinstance(fn, triton.runtime.JITFunction) else fn.fn  # an autotuner wraps the kernel
    kinds = {"part_ptr": "*fp32", "sync_ptr": "*i32"}
    signature = {a: "constexpr" if a in consts else kinds.get(a, "*bf16" if a.endswith("_ptr") else "i32")
                 for a in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
               if a.endswith("_ptr") or a in divisible}
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=aligned)
    return accesses(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"])


@pytest.fixture(scope="module")
def counted():
    return sm90_child(__file__)


def test_odd_size_costs_step_2_its_vectors_and_step_3_gets_them_back(counted):
    before, after = counted["add step 2, n % 16 != 0"], counted["add step 3, n % 16 != 0"]
    assert before["ld.global.v4.b32"] == before["st.global.v4.b32"] == 0 and before["ld.global.b16"] > 0
    assert after["ld.global.v4.b32"] > 0 and after["st.global.v4.b32"] > 0  # the unmasked full blocks


def test_odd_rows_cost_softmax_step_4_its_vectors_and_step_5_gets_them_back(counted):
    before, after = counted["softmax step 4, 50257 columns"], counted["softmax step 5, 50257 columns"]
    assert before["ld.global.v4.b32"] == before["st.global.v4.b32"] == 0 and before["ld.global.b16"] > 0
    assert after["ld.global.v4.b32"] > 0 and after["st.global.v4.b32"] > 0  # the aligned window's body
    # the edge tile: one element a thread, not a scalar copy of the whole tile
    assert after["ld.global.b16"] <= 2 and after["st.global.b16"] <= 2
    aligned = counted["softmax step 5, 4096 columns"]  # no partial groups: no edge tile at all
    assert aligned["ld.global.b16"] == aligned["st.global.b16"] == 0 and aligned["ld.global.v4.b32"] > 0


if __name__ == "__main__":
    sm90_main(lambda: {name: compile_case(*case) for name, *case in CASES})
