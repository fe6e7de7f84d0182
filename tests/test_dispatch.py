"""step=None's measured dispatch (the table, its lookup, explain), the shape suite's summary made
from recorded rows, and the public call's signature cache. CPU: Triton steps under the interpreter."""
import math

import pytest
import torch

import rosetta
from rosetta import calls, dispatch_table
from rosetta.bench.docs import suite_report
from rosetta.bench.run import shape_suite
from rosetta.dispatch_table import Entry, Table


def softmax_table(ranking_small, ranking_long):
    """A table with one short-row and one long-row case for softmax/triton fp32."""
    return Table("Test GPU", "abc123", (
        Entry("softmax", "triton", "float32", (64, 1000), "ra", ranking_small),
        Entry("softmax", "triton", "float32", (64, 131072), "ra", ranking_long)))


@pytest.fixture
def table(monkeypatch):
    """Make decide() read `softmax_table` for any device (CPU tensors included)."""
    def use(t):
        monkeypatch.setattr(dispatch_table, "for_device", lambda device: t)
        calls.forget()
    yield use
    calls.forget()


def test_table_round_trip(tmp_path):
    t = softmax_table(((2, 0.01), (3, 0.02)), ((4, 0.5),))
    dispatch_table.write(tmp_path / "d.json", t.gpu, t.git_sha, list(t.entries))
    back = dispatch_table.read(tmp_path / "d.json")
    assert (back.gpu, back.git_sha, back.entries) == (t.gpu, t.git_sha, t.entries)
    assert dispatch_table.read(tmp_path / "missing.json") is None


def test_nearest_case_in_log2_space():
    t = softmax_table(((2, 0.01),), ((4, 0.5),))
    x = torch.randn(100, 1500)  # between the cases, nearer the short rows in log2 of each dimension
    entry, dist, same = t.nearest("softmax", "triton", torch.float32, (x,))
    assert entry.shape == (64, 1000) and same and dist == pytest.approx(math.log2(100 / 64) + math.log2(1.5))
    assert t.nearest("softmax", "triton", torch.float32, (torch.randn(3, 100_000),))[0].shape == (64, 131072)
    assert t.nearest("softmax", "cuda", torch.float32, (x,)) is None  # nothing measured for cuda
    assert t.nearest("softmax", "triton", torch.float16, (x.half(),)) is None


def test_layout_class():
    a = torch.randn(8, 16)
    assert dispatch_table.layout_class((a,)) == "ra"
    assert dispatch_table.layout_class((a.t(),)) == "ca"
    assert dispatch_table.layout_class((torch.randn(8, 7),)) == "ru"  # 28-byte rows
    assert dispatch_table.layout_class((a[:, 1:],)) == "ru"  # starts 4 bytes in
    assert dispatch_table.layout_class((torch.randn(100),)) == "ra"


def test_decide_takes_the_measured_fastest(table):
    table(softmax_table(((2, 0.010), (4, 0.011), (3, 0.02)), ((4, 0.5), (2, 0.9))))
    x = torch.randn(64, 1000)
    d = rosetta.decide("softmax", "triton", torch.float32, (x,))
    assert d.variant.step == 2
    text = str(rosetta.explain("softmax", x))
    assert "softmax/triton/02_online" in text and "64x1000" in text and "Test GPU" in text
    assert "step  4" in text and "1.10x the fastest" in text
    assert rosetta.decide("softmax", "triton", torch.float32, (torch.randn(9, 200_000),)).variant.step == 4


def test_decide_skips_a_ranked_step_whose_limits_refuse(table):
    # Triton softmax step 1 declares `Max: cols <= 32768`: at 40,000 the next ranked step runs
    table(softmax_table(((1, 0.01), (3, 0.02)), ((1, 0.01), (3, 0.02))))
    assert rosetta.decide("softmax", "triton", torch.float32, (torch.randn(4, 1000),)).variant.step == 1
    d = rosetta.decide("softmax", "triton", torch.float32, (torch.randn(4, 40_000),))
    assert d.variant.step == 3 and "limits refuse" in str(d)


def test_no_table_falls_back_to_the_last_step_and_says_so():
    d = rosetta.explain("softmax", torch.randn(4, 5))
    assert d.variant == rosetta.variants("softmax", "triton")[-1]
    assert "last step that takes the inputs" in str(d) and "bench-suite" in str(d)


def test_public_call_follows_the_table(table):
    x = torch.randn(64, 1000)
    table(softmax_table(((2, 0.01),), ((2, 0.01),)))
    torch.testing.assert_close(rosetta.softmax(x), torch.softmax(x, -1))
    assert len([k for k in calls._PREPARED if k[0] == "softmax"]) == 1
    rosetta.softmax(x)  # the same signature: no new entry
    assert len([k for k in calls._PREPARED if k[0] == "softmax"]) == 1
    rosetta.softmax(x[:, :999])  # new strides and shape: a new signature
    assert len([k for k in calls._PREPARED if k[0] == "softmax"]) == 2


def test_public_call_signature_tells_grad_mode_and_requires_grad_apart():
    """One shape, three signatures: a plain tensor, the same with requires_grad, and that again
    under torch.no_grad(). Each call gets its own path: a graph only where a gradient is taken."""
    calls.forget()
    x = torch.randn(8, 100)
    xg = x.clone().requires_grad_()
    assert rosetta.softmax(x).grad_fn is None
    y = rosetta.softmax(xg)
    assert y.grad_fn is not None
    (dx,) = torch.autograd.grad(y, xg, torch.ones_like(y))
    torch.testing.assert_close(dx, torch.zeros_like(dx), atol=1e-6, rtol=0)  # softmax rows sum to 1
    with torch.no_grad():
        assert rosetta.softmax(xg).grad_fn is None
    assert rosetta.softmax(xg).grad_fn is not None  # the no_grad signature did not take its place
    assert len([k for k in calls._PREPARED if k[0] == "softmax"]) == 3


def test_bad_inputs_are_refused_every_time():
    for _ in range(2):  # nothing is cached for a call that failed its checks
        with pytest.raises(ValueError, match="inner dimensions"):
            rosetta.matmul(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        rosetta.softmax(torch.randn(3, 4), backend="cuda")


@pytest.mark.parametrize("op, make", [
    ("softmax", lambda: (torch.randn(5, 33, dtype=torch.float64).float(),)),
    ("matmul", lambda: (torch.randn(5, 7), torch.randn(7, 3))),
])
def test_public_call_gradients_match_torch(op, make):
    """requires_grad takes the eager autograd.Function around the same step's kernels."""
    inputs = tuple(t.requires_grad_() for t in make())
    ref_inputs = tuple(t.detach().clone().requires_grad_() for t in inputs)
    out = getattr(rosetta, op)(*inputs)
    ref = torch.softmax(*ref_inputs, -1) if op == "softmax" else ref_inputs[0] @ ref_inputs[1]
    weights = torch.randn(out.shape)
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    for mine, theirs in zip(inputs, ref_inputs):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def test_vmap_over_public_calls_takes_the_registered_ops():
    """Inside a functorch transform the tensors have no storage to key a call signature on, so the
    call takes the registered torch op, as tracing does (torch batches it)."""
    signatures = len(calls._PREPARED)
    x = torch.randn(3, 4, 8)
    torch.testing.assert_close(torch.func.vmap(rosetta.softmax)(x), torch.softmax(x, -1))
    a, b = torch.randn(3, 5, 6), torch.randn(6, 7)
    torch.testing.assert_close(torch.func.vmap(lambda t: rosetta.matmul(t, b))(a), a @ b, rtol=1e-4, atol=1e-5)
    assert len(calls._PREPARED) == signatures  # no eager signature was made of the batched tensors


def suite_rows():
    """Recorded rows of two softmax cases: torch and two Triton steps timed, the eager calls."""
    rows = []

    def row(shape, backend, step, ms, role="suite", status="ok"):
        rows.append({"op": "softmax", "dtype": "float32", "shape": shape, "backend": backend, "step": step,
                     "p50_ms": ms, "role": role, "status": status})
    for shape, torch_ms, (s2, s4), calls_ in (("64x1000", 0.010, (0.008, 0.012), (0.015, 0.012)),
                                              ("4096x4096", 0.100, (0.110, 0.090), (0.101, 0.091))):
        row(shape, "torch", 0, torch_ms)
        row(shape, "triton", 2, s2)
        row(shape, "triton", 4, s4)
        row(shape, "triton", 1, None, status="slow: 5x the fastest call here, not timed")
        row(shape, "torch", 0, calls_[0], role="suite-eager")
        row(shape, "triton", 2 if s2 < s4 else 4, calls_[1], role="suite-eager")
    return rows


def test_table_entries_rank_the_timed_steps():
    entries = shape_suite.table_entries(suite_rows())
    assert [(e.shape, e.ranking) for e in entries] == [
        ((64, 1000), ((2, 0.008), (4, 0.012))), ((4096, 4096), ((4, 0.090), (2, 0.110)))]
    assert all(e.layout == "ra" for e in entries)


def test_suite_summary_and_heatmap(tmp_path):
    rows = suite_rows()
    records = suite_report.per_case(rows, "softmax", "triton")
    assert [(r["step"], r["fastest"]) for r in records] == [(2, 2), (4, 4)]
    s = suite_report.stats(records)
    assert s["graph_geomean"] == pytest.approx(math.sqrt(0.010 / 0.008 * 0.100 / 0.090))
    assert s["worst"]["shape"] == "4096x4096" and s["dispatch_within"] == 2
    assert s["eager_slow_cases"] == 1 and s["eager_slow_geomean"] == pytest.approx(0.101 / 0.091)
    text = suite_report.summary_table(rows)
    assert "| softmax | triton | 2 |" in text
    path = suite_report.write(tmp_path, rows)
    assert "## softmax" in path.read_text() and (tmp_path / "plots" / "suite_softmax.png").stat().st_size > 0


def test_each_ratio_takes_torch_from_its_own_run():
    """A backend's suite re-run alone (`--suite --backend triton`) leaves the other backend's rows
    of an earlier run: each ratio divides by the torch rows of the run that timed the step, and a
    re-run keeps the torch rows the other backend's ratios need (shape_suite.kept_rows)."""
    rows = []

    def row(backend, step, ms, run, role="suite"):
        rows.append({"op": "softmax", "dtype": "float32", "shape": "64x1000", "backend": backend, "step": step,
                     "p50_ms": ms, "role": role, "status": "ok", "git_sha": run})
    row("torch", 0, 0.010, "old"), row("cuda", 5, 0.010, "old")
    row("torch", 0, 0.020, "old", "suite-eager"), row("cuda", 5, 0.010, "old", "suite-eager")
    row("torch", 0, 0.020, "new"), row("triton", 2, 0.010, "new")
    row("torch", 0, 0.030, "new", "suite-eager"), row("triton", 2, 0.010, "new", "suite-eager")
    (cuda,), (triton,) = (suite_report.per_case(rows, "softmax", b) for b in ("cuda", "triton"))
    assert (cuda["graph"], cuda["eager"]) == (pytest.approx(1.0), pytest.approx(2.0))
    assert (triton["graph"], triton["eager"]) == (pytest.approx(2.0), pytest.approx(3.0))
    case = {("softmax", "float32", "64x1000")}
    kept = shape_suite.kept_rows(rows, case, ("triton",))
    assert {(r["backend"], r["git_sha"]) for r in kept} == {("torch", "old"), ("cuda", "old")}
    assert shape_suite.kept_rows(rows, case, ("cuda", "triton")) == []
    assert shape_suite.kept_rows(rows, {("softmax", "float32", "8x8")}, ("triton",)) == rows


def test_every_op_has_a_suite_with_odd_shapes():
    from rosetta.ops import SPECS
    for op, spec in SPECS.items():
        shapes = [s for s, _ in spec.suite.cases]
        assert len(shapes) >= 10, op
        assert any(any(d % 2 for d in s) for s in shapes), f"{op}: no odd size in its suite"


def bench_row(op, backend, step, shape, ms, direction="forward", role="headline", status="ok"):
    return {"op": op, "backend": backend, "step": step, "label": f"{op}/{backend}/{step:02d}", "dtype": "bfloat16",
            "shape": shape, "direction": direction, "role": role, "status": status, "p50_ms": ms, "git_sha": "run1"}


def test_an_op_is_ranked_at_its_headlines(table):
    """Every op's bench.csv forward headlines rank its steps for step=None: fastest first, wrong and
    backward rows left out, a causal case (the same problem shape) not counted twice, and explain
    says where the ranking came from."""
    rows = [bench_row("attention", "triton", 2, "1x2x256x256x64", 1.0),
            bench_row("attention", "triton", 3, "1x2x256x256x64", 1.5),
            bench_row("attention", "triton", 1, "1x2x256x256x64", 0.5, status="wrong"),
            bench_row("attention", "triton", 1, "1x2x256x256x64", 0.1, direction="backward"),
            bench_row("attention", "triton", 3, "1x2x256x256x64x1", 0.2),  # causal: same inputs
            bench_row("softmax", "triton", 1, "64x1000", 1.0)]
    entries = shape_suite.headline_entries(rows)
    assert [(e.op, e.shape, e.ranking, e.source, e.run) for e in entries] == [
        ("attention", (1, 2, 256, 256, 64), ((2, 1.0), (3, 1.5)), "headline", "run1"),
        ("softmax", (64, 1000), ((1, 1.0),), "headline", "run1")]
    table(Table("Test GPU", "abc123", tuple(entries)))
    q, k, v = (torch.randn(1, 2, 200, 64, dtype=torch.bfloat16) for _ in range(3))
    decision = rosetta.explain("attention", q, k, v, backend="triton")
    assert decision.variant.step == 2
    assert "headline" in decision.reason and "run1" in decision.reason


def test_a_call_with_a_gradient_is_ranked_by_forward_plus_backward(table):
    """A step can win the forward and lose the pair (the norms' split-row steps): a call that will
    take a gradient is matched against forward + backward, one without against the forward."""
    def row(step, ms, direction="forward"):
        return bench_row("rms_norm", "triton", step, "64x8192", ms, direction)
    rows = [row(3, 1.0), row(3, 5.0, "backward"), row(4, 1.5), row(4, 2.0, "backward"),
            row(1, 0.9)]  # step 1: no backward timed, so in the forward ranking only
    entry, = shape_suite.headline_entries(rows)
    assert entry.ranking == ((1, 0.9), (3, 1.0), (4, 1.5)) and entry.grad_ranking == ((4, 3.5), (3, 6.0))
    table(Table("Test GPU", "abc123", (entry,)))
    x, w = torch.randn(64, 8192, dtype=torch.bfloat16), torch.randn(8192, dtype=torch.bfloat16)
    assert rosetta.decide("rms_norm", "triton", torch.bfloat16, (x, w)).variant.step == 1
    d = rosetta.decide("rms_norm", "triton", torch.bfloat16, (x.requires_grad_(), w))
    assert d.variant.step == 4 and "forward + backward" in d.reason
    with torch.no_grad():
        assert rosetta.decide("rms_norm", "triton", torch.bfloat16, (x, w)).variant.step == 1
    assert dispatch_table.Entry.from_json(entry.to_json()) == entry


def test_headline_cases_join_an_ops_suite(table):
    """An op with a suite keeps its headline cases the suite lacks (the norms' 32,768-column rows),
    and a suite case that is also a headline takes its forward + backward ranking: a call at 64 x
    32768 runs the step measured there, not the choice of the nearest suite case."""
    suite_entries = [Entry("rms_norm", "triton", "bfloat16", (64, 8192), "rara", ((3, 1.0), (4, 1.2))),
                     Entry("rms_norm", "triton", "bfloat16", (64, 16384), "rara", ((2, 1.0), (3, 1.1)))]
    def row(step, shape, ms, direction="forward"):
        return bench_row("rms_norm", "triton", step, shape, ms, direction)
    rows = [row(3, "64x8192", 0.9), row(3, "64x8192", 5.0, "backward"), row(4, "64x8192", 1.1),
            row(4, "64x8192", 2.0, "backward"), row(2, "64x32768", 3.0), row(3, "64x32768", 1.0)]
    entries = shape_suite.with_headlines(suite_entries, shape_suite.headline_entries(rows))
    assert [(e.shape, e.source, e.ranking, e.grad_ranking) for e in entries] == [
        ((64, 8192), "suite", ((3, 1.0), (4, 1.2)), ((4, 3.1), (3, 5.9))),
        ((64, 16384), "suite", ((2, 1.0), (3, 1.1)), ()),
        ((64, 32768), "headline", ((3, 1.0), (2, 3.0)), ())]
    table(Table("Test GPU", "abc123", tuple(entries)))
    x, w = torch.randn(64, 32768, dtype=torch.bfloat16), torch.randn(32768, dtype=torch.bfloat16)
    assert rosetta.decide("rms_norm", "triton", torch.bfloat16, (x, w)).variant.step == 3
    x, w = torch.randn(64, 8192, dtype=torch.bfloat16), torch.randn(8192, dtype=torch.bfloat16)
    assert rosetta.decide("rms_norm", "triton", torch.bfloat16, (x.requires_grad_(), w)).variant.step == 4


def test_eager_calls_are_timed_in_turns_and_a_failing_caller_is_reported(monkeypatch):
    """The suite's eager timing: every caller once a round, in the callers' order, the median
    round kept; a caller that raises comes back as its exception, the others still timed."""
    monkeypatch.setattr(shape_suite.torch.cuda, "synchronize", lambda: None)
    order = []

    def caller(name):
        return lambda: order.append(name)

    def broken():
        raise RuntimeError("no kernel for this shape")

    times = shape_suite.eager_in_turns([caller("torch"), broken, caller("triton")])
    assert isinstance(times[1], RuntimeError)
    assert all(isinstance(t, float) and t > 0 for t in (times[0], times[2]))
    calls = order[8:]  # after each caller's warm-up and calibration (4 calls each)
    per_round = len(calls) // shape_suite.EAGER_ROUNDS
    assert per_round >= 2 and len(calls) == per_round * shape_suite.EAGER_ROUNDS
    first_round = calls[:per_round]
    assert first_round.index("triton") == first_round.count("torch")  # torch's loop, then triton's
