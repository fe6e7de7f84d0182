"""Every registered step on the GPU: dtypes x shapes that break tiling, against fp64 references;
then torch.compile and opcheck over the registered torch ops."""
import pytest
import torch

import rosetta
from cases import GPU_SHAPES, HUGE_NUMEL, make_inputs
from helpers import assert_matches_reference
from rosetta.ops import SPECS

pytestmark = pytest.mark.gpu
VARIANTS = [v for v in rosetta.variants() if v.op in GPU_SHAPES]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_step_matches_fp64(gen, v, dtype):
    for shape in GPU_SHAPES[v.op]:
        inputs = make_inputs(v.op, shape, dtype, "cuda", gen)
        assert_matches_reference(v, inputs, v(*inputs))


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_step_non_contiguous(gen, v):
    inputs = make_inputs(v.op, (999, 1001), torch.float16, "cuda", gen, contiguous=False)
    assert_matches_reference(v, inputs, v(*inputs))


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_launch_into_overwrites_poisoned_output(gen, v):
    inputs = make_inputs(v.op, GPU_SHAPES[v.op][3], torch.float32, "cuda", gen)
    out = SPECS[v.op].allocate(*inputs).fill_(float("nan"))
    assert_matches_reference(v, inputs, v.launch_into(*inputs, out=out))


@pytest.mark.parametrize("v", [v for v in VARIANTS if v.op == "vector_add"], ids=lambda v: v.label)
def test_vector_add_misaligned_pointers(gen, v):
    """Views starting 1 and 3 elements in: 16-byte vector paths must fall back, not fault."""
    x, y = make_inputs(v.op, (4100,), torch.float16, "cuda", gen)
    for dx, dy in [(1, 1), (1, 3), (0, 5)]:
        a, b = x[dx:dx + 4000], y[dy:dy + 4000]
        assert_matches_reference(v, (a, b), v(a, b))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("v", [v for v in VARIANTS if v.op == "vector_add"], ids=lambda v: v.label)
def test_vector_add_past_2_31_elements(gen, v, dtype):
    """2^31 + 17 elements: 32-bit offsets would wrap. Checked exactly, chunk by chunk (an fp64
    copy of the whole would need 51 GB): each element must equal the fp32 sum rounded to dtype."""
    x = torch.randn(HUGE_NUMEL, device="cuda", dtype=dtype, generator=gen)
    y = torch.randn(HUGE_NUMEL, device="cuda", dtype=dtype, generator=gen)
    out = v(x, y)
    chunk = 2**28
    for start in range(0, HUGE_NUMEL, chunk):
        s = slice(start, start + chunk)
        expected = (x[s].float() + y[s].float()).to(dtype)
        bad = (out[s] != expected).nonzero()
        assert bad.numel() == 0, f"{v.label}: wrong at element {start + bad[0].item()}"
    del x, y, out
    torch.cuda.empty_cache()


@pytest.mark.parametrize("backend", rosetta.BACKENDS)
@pytest.mark.parametrize("op", sorted(GPU_SHAPES))
def test_torch_compile_fullgraph(gen, op, backend):
    fn = getattr(rosetta, op)
    inputs = make_inputs(op, GPU_SHAPES[op][3], torch.float32, "cuda", gen)
    eager = fn(*inputs, backend=backend)  # also registers the backend's ops before tracing
    compiled = torch.compile(lambda *args: fn(*args, backend=backend), fullgraph=True)
    torch.testing.assert_close(compiled(*inputs), eager)


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_opcheck(gen, v):
    v(*make_inputs(v.op, (7,), torch.float32, "cuda", gen))  # registers the ops
    inputs = make_inputs(v.op, GPU_SHAPES[v.op][2], torch.float32, "cuda", gen)
    torch.library.opcheck(getattr(torch.ops.rosetta, v.qualname).default, inputs)
