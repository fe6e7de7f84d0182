"""Every registered step on the GPU: each dtype it declares x the spec's test shapes (chosen to
break tiling) x each direction, against fp64 references; strided inputs; autograd,
torch.compile and opcheck over the registered torch ops."""
import threading

import pytest
import torch

import rosetta
from rosetta import calls
from cases import HUGE_NUMEL, make_inputs, poisoned_output, strided_cases
from helpers import GPU, assert_matches_reference, gpu_memory_allows
from rosetta.dispatch import fits
from rosetta.ops import SPECS
from rosetta.ops.spec import as_tuple

pytestmark = pytest.mark.gpu
VARIANTS = rosetta.variants()
STEP_DTYPES = [(v, d) for v in VARIANTS for d in v.dtypes]
DIRECTED = [(v, d, direction) for v, d in STEP_DTYPES for direction in SPECS[v.op].directions()]


def run(v, inputs, direction):
    return v(*inputs) if direction == "forward" else v.backward(*inputs)


@pytest.mark.parametrize("v,dtype,direction", DIRECTED, ids=lambda p: getattr(p, "label", str(p)))
def test_step_matches_fp64(gen, v, dtype, direction):
    for shape in SPECS[v.op].test_shapes:
        inputs = make_inputs(v.op, shape, dtype, GPU, gen, direction)
        if fits(v, inputs):
            assert_matches_reference(v, inputs, run(v, inputs, direction), direction)


@pytest.mark.parametrize("v,dtype", STEP_DTYPES, ids=lambda p: getattr(p, "label", str(p)))
def test_strided_inputs(gen, v, dtype):
    for name, inputs in strided_cases(v.op, dtype, GPU, gen):
        assert any(not t.is_contiguous() for t in inputs), name
        if not fits(v, inputs):  # a declared limit (e.g. TMA alignment): refused, naming other steps
            with pytest.raises(ValueError, match="steps"):
                v(*inputs)
            continue
        assert_matches_reference(v, inputs, v(*inputs))


def first_fitting_shape(v, dtype, gen, direction="forward", start=2):
    """The first test shape from `start` on that the step takes (its declared limits allow)."""
    for shape in SPECS[v.op].test_shapes[start:]:
        inputs = make_inputs(v.op, shape, dtype, GPU, gen, direction)
        if fits(v, inputs) and all(t.numel() for t in inputs):
            return inputs
    pytest.fail(f"{v.label} takes none of the test shapes")


@pytest.mark.parametrize("v,dtype,direction", DIRECTED, ids=lambda p: getattr(p, "label", str(p)))
def test_launch_into_overwrites_poisoned_output(gen, v, dtype, direction):
    inputs = first_fitting_shape(v, dtype, gen, direction, start=3)
    out = poisoned_output(v.op, inputs, direction)
    assert_matches_reference(v, inputs, v.launch_into(*inputs, out=out, direction=direction), direction)


@pytest.mark.parametrize("v,direction", [(v, d) for v in VARIANTS if v.backend == "triton"
                                          for d in SPECS[v.op].directions()], ids=lambda p: getattr(p, "label", str(p)))
def test_repeated_calls_launch_from_the_cache(gen, v, direction):
    """An eager Triton launch repeated with the same specialization runs the compiled kernel it
    recorded (rosetta.triton_launch): fresh data and a NaN-filled output on each of three launches
    of every test shape must still match. The rounds go over all the shapes in turn, so a launch
    from the cache follows other shapes' launches: a step's host code must decide from its own
    launch, not from what another shape's left behind (matmul step 7 skips its reduction by the
    config its launch ran)."""
    for _ in range(3):
        for shape in SPECS[v.op].test_shapes:
            inputs = make_inputs(v.op, shape, v.dtypes[0], GPU, gen, direction)
            if not fits(v, inputs):
                continue
            out = poisoned_output(v.op, inputs, direction)
            assert_matches_reference(v, inputs, v.launch_into(*inputs, out=out, direction=direction), direction)


TICKETED = [v for v in VARIANTS if v.backend == "triton"
            and getattr(rosetta.torch_ops.triton_module(v), "tickets", None) is rosetta.triton_launch.tickets]


@pytest.mark.parametrize("v", TICKETED, ids=lambda v: v.label)
def test_tickets_left_at_zero(gen, v):
    """A Triton step whose kernels meet on counters from triton_launch.tickets (zeroed once per
    stream, never again) leaves every counter at zero: each test shape and direction, launched
    twice (the second launch finds what the first left), matches and leaves no counter set."""
    from rosetta.triton_launch import _TICKETS

    for direction in SPECS[v.op].directions():
        for shape in SPECS[v.op].test_shapes:
            inputs = make_inputs(v.op, shape, v.dtypes[0], GPU, gen, direction)
            if not fits(v, inputs):
                continue
            for _ in range(2):
                out = poisoned_output(v.op, inputs, direction)
                v.launch_into(*inputs, out=out, direction=direction)
                torch.cuda.synchronize()
                assert_matches_reference(v, inputs, out, direction)
                assert not any(t.any() for t in _TICKETS.values()), f"{v.label} {direction} {shape}: a counter left set"


SPLIT_SOFTMAX = [v for v in VARIANTS if v.op == "softmax" and v.backend == "triton" and v.name in ("split_row", "aligned_windows")]


@pytest.mark.parametrize("v", SPLIT_SOFTMAX, ids=lambda v: v.label)
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_split_softmax_counters_left_at_zero(gen, v, direction):
    """Triton softmax steps 4-5 split long rows over programs that meet on counters
    (triton_launch.tickets, zeroed once per stream): launches one after another, on a side stream
    and as a CUDA graph's replays must each match, and leave every counter at zero; a few rows of
    many chunks, and many rows (of an odd length) of a few."""
    from rosetta.triton_launch import _TICKETS

    launch = rosetta.torch_ops.raw_launcher(v, direction)
    for shape in ((3, 131075), (1100, 33001)):
        inputs = make_inputs("softmax", shape, torch.bfloat16, GPU, gen, direction)

        def check(run):
            out = poisoned_output("softmax", inputs, direction)
            run(out)
            torch.cuda.synchronize()
            assert_matches_reference(v, inputs, out, direction)
            assert not any(t.any() for t in _TICKETS.values())

        for _ in range(2):
            check(lambda out: launch(*inputs, out))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            check(lambda out: launch(*inputs, out))
        torch.cuda.current_stream().wait_stream(side)
        captured = poisoned_output("softmax", inputs, direction)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch(*inputs, captured)
        for _ in range(2):
            check(lambda o: (graph.replay(), o.copy_(captured)))


def test_split_k_fixup_counters_per_stream_and_in_graphs(gen):
    """Triton matmul step 9's counters (triton_launch.tickets) are one buffer per stream, zeroed once:
    launches on the default stream, on a side stream and as the replays of a CUDA graph captured on
    a third must each match, and leave every counter at zero."""
    from rosetta.triton_launch import _TICKETS

    v = next(v for v in VARIANTS if v.op == "matmul" and v.name == "split_k_fixup")
    launch = rosetta.torch_ops.raw_launcher(v, "forward")
    a, b = make_inputs("matmul", (16, 3072, 768), torch.bfloat16, GPU, gen)

    def check(run):
        out = torch.full((16, 768), float("nan"), dtype=torch.bfloat16, device=GPU)
        run(out)
        torch.cuda.synchronize()
        assert_matches_reference(v, (a, b), out)
        assert not any(t.any() for t in _TICKETS.values())

    check(lambda out: launch(a, b, out, split_k=4))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        check(lambda out: launch(a, b, out, split_k=4))
    out = torch.empty((16, 768), dtype=torch.bfloat16, device=GPU)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(a, b, out, split_k=4)
    for _ in range(3):
        a.copy_(make_inputs("matmul", (16, 3072, 768), torch.bfloat16, GPU, gen)[0])
        check(lambda o: (graph.replay(), o.copy_(out)))


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_public_call_path_matches(gen, v):
    """What the public call runs for a signature (calls.direct): a CUDA step's `_new`, which
    allocates in C++ and hands the kernel each output through its view's template (reduce_sum's
    0-dim sum as one element); a Triton step's launch, recorded on one of the signature's first
    calls and replayed after (rosetta.triton_launch.Replay). Four calls of every test shape, each
    on fresh data into an output block just filled with NaN, must all match (every output, saved
    statistics too)."""
    params = SPECS[v.op].forward.defaults
    for shape in SPECS[v.op].test_shapes:
        inputs = make_inputs(v.op, shape, v.dtypes[0], GPU, gen)
        if not fits(v, inputs):
            continue
        run = calls.direct(v, "forward", inputs)  # what the public call runs for this signature
        for _ in range(4):
            inputs = make_inputs(v.op, shape, v.dtypes[0], GPU, gen)
            size = as_tuple(SPECS[v.op].forward.allocate(*inputs))[0].numel()
            torch.full((max(size, 1),), float("nan"), device=GPU)  # freed at once: the output may reuse it
            assert_matches_reference(v, inputs, run(*inputs, *params))


@pytest.mark.parametrize("op", ["softmax", "matmul", "reduce_sum", "vector_add", "rms_norm"])
def test_repeated_public_calls_are_replayed(gen, op, monkeypatch):
    """The replay engages: a few calls of one signature in, step=None's Triton step runs its plan."""
    from rosetta.triton_launch import Plan

    replayed, replay = [], Plan.__call__
    monkeypatch.setattr(Plan, "__call__", lambda self, args: (replayed.append(1), replay(self, args))[1])
    inputs = make_inputs(op, SPECS[op].test_shapes[2], torch.float32, GPU, gen)
    for _ in range(5):
        calls.call(op, "triton", None, inputs, SPECS[op].forward.defaults)
    assert replayed, f"{op}: no call of the signature was replayed"


def test_replay_keeps_inputs_that_share_memory_apart(gen):
    """One signature, called with one tensor twice and with two: a recording made while the
    inputs shared memory would not know which pointer came from which, so none is made then,
    and a recording made from separate inputs serves shared ones."""
    x, y = (torch.randn(4099, device=GPU, generator=gen) for _ in range(2))
    for pair in [(x, x)] * 3 + [(x, y)] * 3 + [(x, x), (y, x)]:
        torch.testing.assert_close(rosetta.vector_add(*pair), pair[0] + pair[1], rtol=0, atol=0)


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_public_path_fills_a_recycled_nan_block(gen, v):
    """The caching allocator hands out a block just freed: fill one with NaN first, so a step
    that skips elements cannot inherit a neighbour's right answer."""
    inputs = first_fitting_shape(v, v.dtypes[0], gen)
    size = as_tuple(SPECS[v.op].forward.allocate(*inputs))[0].numel()
    torch.full((size,), float("nan"), dtype=v.dtypes[0] if v.op != "reduce_sum" else torch.float32,
               device=GPU)  # freed at once: the next allocation of this size reuses it
    assert_matches_reference(v, inputs, v(*inputs))


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_first_cuda_call_of_a_new_thread(gen, v):
    """torch's autograd worker runs backward kernels on a thread of its own, whose first CUDA call
    may be a step's: a thread with no context bound yet (a driver call such as the TMA steps'
    tensor-map encoding fails there unless the step binds one) must still get the right answer."""
    inputs = first_fitting_shape(v, v.dtypes[0], gen)
    torch.cuda.synchronize()
    got = {}

    def body():
        try:
            got["out"] = v(*inputs)
            torch.cuda.synchronize()
        except Exception as exc:  # re-raised on the test's thread
            got["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in got:
        raise got["error"]
    assert_matches_reference(v, inputs, got["out"])


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_dtype_not_declared_is_refused(gen, v):
    missing = [d for d in (torch.float32, torch.float16, torch.bfloat16) if d not in v.dtypes]
    if not missing:
        pytest.skip(f"{v.label} takes every float dtype")
    inputs = make_inputs(v.op, SPECS[v.op].test_shapes[2], missing[0], GPU, gen)
    # the message names the steps that take it, or says that none of the ladder's does
    with pytest.raises(ValueError, match=rf"{v.label} takes .* got {missing[0]}; .*(steps \d|no .* step does)"):
        v(*inputs)


def breaking_shape(quantity: str, relation: str, limit: int, dtype) -> tuple:
    """A shape that breaks one declared bound (and, for the long-row softmax steps, no other)."""
    size = dtype.itemsize
    if quantity == "cols":
        return (2, limit + 1) if relation == "<=" else (2, limit - 1)
    if quantity == "row_bytes":  # one row past the bytes, in whole 64-element vectors
        return (2, (limit // size // 64 + 1) * 64)
    if quantity == "output_tiles":  # 16 x 32 tiles of 128 x 128
        return (2048, 64, 4096)
    if quantity == "m_rows":
        return (limit + 1, 64, 32)
    if quantity == "k":  # linear_gelu's K below its minimum (K = 0: no GEMM to fuse into)
        return (16, limit - 1, 16)
    return {"tma_unaligned": (16, 33, 16),  # K = 33: 66-byte rows
            "unaligned_rows": (2, 16387),  # past step 5's rows, not whole 16-byte vectors
            "uneven_register_slices": (2, 16388)}[quantity]  # 2 slices of 8,194: not whole fp32 vectors


BOUNDS = [(v, q, rel, limit) for v in VARIANTS
          for rel, pairs in (("<=", v.bounds), (">=", v.minimums)) for q, limit in pairs]


@pytest.mark.parametrize("v,quantity,relation,limit", BOUNDS,
                         ids=lambda p: getattr(p, "label", str(p)))
def test_declared_limit_raises_naming_the_steps_that_take_it(gen, v, quantity, relation, limit):
    if quantity in ("tma_out_unaligned", "b_column_major"):  # b column-major (out's rows: 126 bytes)
        rows = min(4, dict(v.bounds).get("m_rows", 4))  # within the step's other bound, a GEMV's rows
        a, b = make_inputs(v.op, (rows, 32, 63), v.dtypes[0], GPU, gen)
        inputs = (a, b.t().contiguous().t())
    else:
        inputs = make_inputs(v.op, breaking_shape(quantity, relation, limit, v.dtypes[0]), v.dtypes[0], GPU, gen)
    # the message names the steps that take it, or says no step of the ladder does
    with pytest.raises(ValueError, match=rf"{quantity} {relation} {limit}, got {quantity} = \d+.*; .*(steps \d|no step)"):
        v(*inputs)


def fitting_case(v, shapes, dtype, gen, grad=False):
    """(shape, inputs) of the first of `shapes` that the step takes (with a gradient to take, if
    `grad`)."""
    for shape in shapes:
        inputs = make_inputs(v.op, shape, dtype, GPU, gen)
        inputs = tuple(t.requires_grad_() for t in inputs) if grad else inputs
        if fits(v, inputs):
            return shape, inputs
    pytest.fail(f"{v.label} takes none of {shapes}")


def test_shapes_from(op, first):
    """The op's test shape `first`, then every non-empty one: a step with a `Min:` line (the norms'
    long-row steps) takes the first of them it fits."""
    shapes = SPECS[op].test_shapes
    return [shapes[first], *(s for s in shapes if 0 not in s)]


# ---- the norms' parameter gradients: a fixed summation order ------------------------------------
NORMS = [v for v in VARIANTS if v.op in ("rms_norm", "layer_norm")]


@pytest.mark.parametrize("v", NORMS, ids=lambda v: v.label)
def test_norm_backward_gives_the_same_bits_every_call(gen, v):
    """dweight (and dbias) are sums over rows that every step adds in a fixed order (partial rows,
    no atomics; the split-row steps add their slices' partials in slice order), so a repeated
    call gives the same bits. Rows of 4,097 and 32,768 columns: step 4 splits the latter."""
    for shape in ((300, 4097), (129, 32768)):
        inputs = make_inputs(v.op, shape, torch.bfloat16, GPU, gen, "backward")
        if not fits(v, inputs):
            continue
        first, again = as_tuple(v.backward(*inputs)), as_tuple(v.backward(*inputs))
        for a, b in zip(first, again):
            assert torch.equal(a, b), f"{v.label} backward at {shape}: two calls differ"


# ---- autograd, torch.compile, opcheck -----------------------------------------------------------
DIFFERENTIABLE = [v for v in VARIANTS if SPECS[v.op].autograd]


@pytest.mark.parametrize("v", DIFFERENTIABLE, ids=lambda v: v.label)
def test_autograd_runs_the_same_step(gen, v):
    """Gradients through the step's own kernels against fp64 autograd on the same inputs."""
    dtype = v.dtypes[0]
    # matmul: rows TMA can read, else K = 1, whose backward products the small-M steps take
    # (dA = dC @ B^T with B^T a single column, dB = A^T @ dC with one row; M = 1 for the one-row
    # GEMV); softmax: short rows,
    # else the long ones steps 6-8 are meant for; other ops: the fourth test shape first
    shapes = {"softmax": [(37, 777), (5, 50000), (3, 32768)],
              "matmul": [(64, 128, 48), (8, 1, 8), (1, 1, 8)]}.get(v.op) or test_shapes_from(v.op, 3)
    inputs = list(fitting_case(v, shapes, dtype, gen, grad=True)[1])
    out = as_tuple(v(*inputs))[0]  # the first output (saved statistics have no gradient)
    grad = torch.randn(out.shape, device=GPU, generator=gen).to(dtype)
    got = torch.autograd.grad(out, inputs, grad)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_out = as_tuple(SPECS[v.op].forward.reference(*ref_inputs))[0]
    expected = torch.autograd.grad(ref_out, ref_inputs, grad.double())
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for g, e in zip(got, expected):
        assert g.dtype == dtype
        err = ((g.double() - e).norm() / e.norm().clamp_min(1e-30)).item()
        assert err < tol, f"{v.label}: gradient relative error {err:.3g} >= {tol}"


@pytest.mark.parametrize("backend", rosetta.BACKENDS)
@pytest.mark.parametrize("op", rosetta.ops_with_steps())
def test_torch_compile_fullgraph_forward_and_backward(gen, op, backend):
    torch._dynamo.reset()  # one lambda code object for all 8 cases: past the recompile limit, fullgraph raises
    public = getattr(rosetta, op)
    fn = (lambda *args, **kw: public(*args, seed=7, **kw)) if op == "dropout" else public  # one mask for both
    shape = SPECS[op].test_shapes[3]
    dtype = torch.float32 if torch.float32 in SPECS[op].dtypes else torch.bfloat16
    inputs = make_inputs(op, shape, dtype, GPU, gen)
    eager = fn(*inputs, backend=backend)  # also registers the backend's ops before tracing
    compiled = torch.compile(lambda *args: fn(*args, backend=backend), fullgraph=True)
    # Inductor autotunes a user Triton kernel itself: an autotuned step may run another config
    # there, the same math summed in another order (a reduction: rounding apart, one bf16 ulp)
    close = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(compiled(*inputs), eager, **close)
    if SPECS[op].autograd and eager.numel():
        leaves = [t.clone().requires_grad_() for t in inputs]
        compiled(*leaves).sum().backward()
        eager_leaves = [t.clone().requires_grad_() for t in inputs]
        fn(*eager_leaves, backend=backend).sum().backward()
        for a, b in zip(leaves, eager_leaves):
            torch.testing.assert_close(a.grad, b.grad, **close)


@pytest.mark.parametrize("backend", rosetta.BACKENDS)
def test_torch_compile_traces_the_tma_steps_forward_and_backward(gen, backend):
    """The 16-bit default is a TMA step whose limits are judged while dynamo traces (strides only:
    it cannot read addresses); aligned a.t() also runs the backward's transposed operands."""
    torch._dynamo.reset()
    a = torch.randn(136, 72, device=GPU, generator=gen).to(torch.bfloat16).t()
    b = torch.randn(136, 40, device=GPU, generator=gen).to(torch.bfloat16)
    assert rosetta.best("matmul", backend, torch.bfloat16, (a, b)).bounds, "not a TMA step"
    eager_leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
    eager = rosetta.matmul(*eager_leaves, backend=backend)  # also registers the ops before tracing
    eager.float().square().sum().backward()
    compiled = torch.compile(lambda x, y: rosetta.matmul(x, y, backend=backend), fullgraph=True)
    leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
    out = compiled(*leaves)
    torch.testing.assert_close(out, eager)
    out.float().square().sum().backward()
    for x, y in zip(leaves, eager_leaves):
        torch.testing.assert_close(x.grad, y.grad)


# The registration is the same code for every step of a backend, so the costly check (trace and
# compile with dynamic shapes) runs on each ladder's last step; the rest run on every step.
LAST_STEPS = {v.label for v in VARIANTS if v is rosetta.variants(v.op, v.backend)[-1]}
QUICK_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")
FULL_CHECKS = QUICK_CHECKS + ("test_aot_dispatch_dynamic",)


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.label)
def test_opcheck(gen, v):
    dtype = v.dtypes[0]
    shapes = {"softmax": [(7, 33), (2, 32768)], "matmul": [(24, 16, 8), (8, 1, 8), (1, 1, 8)]}.get(v.op) \
        or test_shapes_from(v.op, 2)
    shape, inputs = fitting_case(v, shapes, dtype, gen, grad=bool(SPECS[v.op].autograd))
    inputs = tuple(t.detach() for t in inputs)
    v(*inputs)  # registers the ops
    if SPECS[v.op].autograd:
        inputs = tuple(t.requires_grad_() for t in inputs)
    checks = FULL_CHECKS if v.label in LAST_STEPS else QUICK_CHECKS
    spec = SPECS[v.op]
    torch.library.opcheck(getattr(torch.ops.rosetta, v.qualname).default, (*inputs, *spec.forward.defaults),
                          test_utils=checks)
    if spec.backward:
        back = make_inputs(v.op, shape, dtype, GPU, gen, "backward")
        torch.library.opcheck(getattr(torch.ops.rosetta, v.qualname + "_backward").default,
                              (*back, *spec.backward.defaults), test_utils=checks)


# ---- >= 2^31 elements ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("v", rosetta.variants("vector_add"), ids=lambda v: v.label)
def test_vector_add_past_2_31_elements(gen, huge_gpu_memory, v, dtype):
    """2^31 + 17 elements: 32-bit offsets would wrap. Checked exactly, chunk by chunk (an fp64
    copy of the whole would need 51 GB): each element must equal the fp32 sum rounded to dtype."""
    if not gpu_memory_allows(3 * HUGE_NUMEL * dtype.itemsize + 2**32):
        pytest.skip("not enough GPU memory")
    x = torch.randn(HUGE_NUMEL, device=GPU, dtype=dtype, generator=gen)
    y = torch.randn(HUGE_NUMEL, device=GPU, dtype=dtype, generator=gen)
    out = v(x, y)
    chunk = 2**28
    for start in range(0, HUGE_NUMEL, chunk):
        s = slice(start, start + chunk)
        expected = (x[s].float() + y[s].float()).to(dtype)
        bad = (out[s] != expected).nonzero()
        assert bad.numel() == 0, f"{v.label}: wrong at element {start + bad[0].item()}"


def best_steps(op):
    return {rosetta.best(op, b, torch.bfloat16) for b in rosetta.BACKENDS if rosetta.variants(op, b)
            and any(torch.bfloat16 in v.dtypes for v in rosetta.variants(op, b))}


@pytest.mark.slow
@pytest.mark.parametrize("v", sorted(best_steps("softmax"), key=lambda v: v.label), ids=lambda v: v.label)
def test_softmax_past_2_31_elements(gen, huge_gpu_memory, v):
    """(2^16 + 3) rows of 2^15 bf16: 2^31 + 98,304 elements; row offsets past 2^31 must not wrap.
    Checked row block by row block against fp32 math."""
    rows, cols = 2**16 + 3, 2**15
    if not gpu_memory_allows(3 * rows * cols * 2 + 2**32):
        pytest.skip("not enough GPU memory")
    x = torch.empty(rows, cols, device=GPU, dtype=torch.bfloat16).normal_(generator=gen)
    out = v.launch_into(x, out=poisoned_output("softmax", (x,)))  # into NaN, as the matmul test below
    for start in range(0, rows, 4096):
        s = slice(start, start + 4096)
        expected = torch.softmax(x[s].float(), -1)
        err = ((out[s].float() - expected).abs() / (expected + 1e-7 * expected.amax(-1, keepdim=True))).max().item()
        assert err < 1e-2, f"{v.label}: rows {start}..: error {err:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", rosetta.BACKENDS)
def test_matmul_output_past_2_31_elements(gen, huge_gpu_memory, backend):
    """A 46,344 x 46,344 bf16 output (2^31 + 282,688 elements) with K = 16: output offsets past 2^31
    must not wrap (46,344 keeps rows a multiple of 16 bytes, which TMA steps need). Checked block
    by block against fp32 math."""
    m = n = 46344
    if not gpu_memory_allows(m * n * 2 + 2**32):
        pytest.skip("not enough GPU memory")
    a = torch.randn(m, 16, device=GPU, generator=gen).to(torch.bfloat16)
    b = torch.randn(16, n, device=GPU, generator=gen).to(torch.bfloat16)
    v = rosetta.best("matmul", backend, torch.bfloat16, (a, b))  # step=None's choice for this shape
    # Into NaN: every step gets the same seeded inputs, and a block just given back may still
    # hold the previous step's right answer, which would hide tiles this one never writes.
    out = v.launch_into(a, b, out=poisoned_output("matmul", (a, b)))
    for start in range(0, m, 4096):
        expected = a[start:start + 4096].float() @ b.float()
        scale = a[start:start + 4096].float().abs() @ b.float().abs()
        got = out[start:start + 4096].float()
        wrong = ~((got - expected).abs() / scale.clamp_min(1e-30) < 1e-2)  # NaN is wrong
        if wrong.any():
            r, c = (int(i) for i in wrong.nonzero()[0])
            pytest.fail(f"{v.label}: {int(wrong.sum())} wrong in rows {start}..{start + 4095}, the first at "
                        f"({start + r}, {c}): got {got[r, c].item()}, expected {expected[r, c].item()}")
