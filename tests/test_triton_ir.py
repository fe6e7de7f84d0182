"""Triton matmul step 6 really is warp-specialized on sm_90, and step 5 is not; step 10 runs wgmma fed
by TMA and adds its split tiles behind an atomic ticket: proved from the IR of an ahead-of-time
compile for GPUTarget("cuda", 90, 32), no GPU needed.

Why a test: in Triton 3.6 on sm_90, tl.range(..., warp_specialize=True) takes effect only on an
unflattened loop (flatten=False) at num_warps = 4; with flatten=True or 8 warps it is dropped without
a warning and step 5's single-stream code comes out, still correct, just not what step 6 claims.
What proves it took effect: the TTGIR has a ttg.warp_specialize op (partition0, ...), the kernel
runs 12 warps (4 + two 4-warp consumer partitions) and the PTX moves registers between them with
setmaxnreg.dec / setmaxnreg.inc. Step 5's PTX at the same 4 warps has none of it.
Each step compiles with its first 4-warp autotune config, bf16, row-major, 132 SMs. The compile runs
in a child process without TRITON_INTERPRET: under the interpreter (make test) triton's own @jit
library functions are interpreter objects, which the compiler cannot use."""
import functools

from helpers import sm90_child, sm90_main

STEPS = (5, 6, 10)


def compile_sm90(step):
    """(child) The step's kernel, loaded as the bindings load it, compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    import rosetta
    from rosetta.torch_ops import triton_module

    module = triton_module(next(v for v in rosetta.variants(op="matmul", backend="triton") if v.step == step))
    fn = next(o for o in vars(module).values() if isinstance(o, triton.runtime.Autotuner)).fn
    config = next(c for c in module.CONFIGS if c.num_warps == 4)
    consts = {**config.kwargs, "NUM_SMS": 132, **{k: False for k in ("A_COLS", "B_COLS") if k in fn.arg_names}}
    pointers = {"part_ptr": "*fp32", "ticket_ptr": "*i32"}  # step 10's workspace and counters
    signature = {a: "constexpr" if a in consts else pointers.get(a, "*bf16") if a.endswith("_ptr") else "i32"
                 for a in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a not in consts}
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=aligned)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": config.num_stages})
    return {"ttgir": k.asm["ttgir"], "ptx": k.asm["ptx"], "num_warps": k.metadata.num_warps}


@functools.cache
def compiled() -> dict:
    return sm90_child(__file__)


def test_step6_is_warp_specialized_step5_is_not():
    ir = compiled()
    ws, flat = ir["6"], ir["5"]
    assert "ttg.warp_specialize" in ws["ttgir"] and "partition0" in ws["ttgir"]
    assert ws["num_warps"] == 12, "warp_specialize was dropped: no consumer partitions"
    assert "setmaxnreg.dec" in ws["ptx"] and "setmaxnreg.inc" in ws["ptx"]
    assert "ttg.warp_specialize" not in flat["ttgir"] and "setmaxnreg" not in flat["ptx"]
    assert flat["num_warps"] == 4


def test_step10_is_wgmma_fed_by_tma_with_an_atomic_fix_up():
    ptx = compiled()["10"]["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx  # tensor cores, TMA loads
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx  # the TMA store
    assert "atom.global.gpu.acq_rel.add" in ptx  # the split tile's ticket


if __name__ == "__main__":
    sm90_main(lambda: {step: compile_sm90(step) for step in STEPS})
