"""The harness on recorded H100 data (tests/fixtures: a real bench.csv, the raw ncu CSV of every
step, a real hardware.json): ncu parsing, tables, KERNEL_LOG generation, plots, line counts."""
import shutil
from pathlib import Path

import pytest

import rosetta
from rosetta.bench import lines, results
from rosetta.bench.docs import log, markers, plots, report, tables
from rosetta.bench.profiling import ncu
from rosetta.ops import SPECS
from rosetta.bench.run.suite import PLACEMENTS, placements_that_fit, subjects

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def rows():
    return results.read_rows(FIXTURES / "bench.csv")


@pytest.fixture(scope="module")
def raw_steps():
    return ncu.read_raw(FIXTURES / "ncu_raw.csv")


# ---- ncu ---------------------------------------------------------------------------------------

def test_ncu_number_strips_thousands_separators():
    assert ncu.number("2,147,501,056") == 2147501056.0
    assert ncu.number("91.14") == 91.14
    assert ncu.number("n/a") is None and ncu.number("") is None


def test_ncu_parse_raw_units_row_and_chatter():
    text = ('==PROF== Connected to process 1\n"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum"\n'
            '"","","us","Mbyte"\n"0","k","1,234.5","2,048"\n==PROF== Disconnected\n')
    (kernel,) = ncu.parse_raw(text)
    assert kernel["gpu__time_duration.sum"] == pytest.approx(1234.5e3)  # us -> ns
    assert kernel["dram__bytes_read.sum"] == 2048e6  # Mbyte -> byte


def test_ncu_raw_file_has_every_profiled_step(rows, raw_steps):
    # the fixtures are one recording (vector_add and reduce_sum, before ablation tiers and later
    # steps): every step and tier its bench timed has its kernels in its raw ncu file
    labels = {r["label"] for r in rows}
    assert len(labels) >= 20 and labels <= set(raw_steps), sorted(labels - set(raw_steps))


def test_ncu_single_kernel_step(raw_steps):
    row = ncu.combine("vector_add/cuda/04_unrolled_blocks", raw_steps["vector_add/cuda/04_unrolled_blocks"])
    assert row["kernels"] == 1
    assert row["dram__bytes_read.sum"] == 2147504384.0  # 2 x 2^30 (+ a few KB)
    assert row["launch__registers_per_thread"] == 32.0
    # the minimal-bytes check of the harness issue: ncu's DRAM bytes within 15% of 3 x 4 x 2^28
    spec = rosetta.ops.SPECS["vector_add"]
    minimal = spec.forward.minimal_bytes(spec.headlines[0].shape, spec.dtypes[0])
    assert abs(row["dram_bytes"] / minimal - 1) < 0.15


def test_ncu_multi_kernel_step_sums_time_and_weights_percentages(raw_steps):
    kernels = raw_steps["reduce_sum/cuda/01_interleaved_divergent"]
    row = ncu.combine("reduce_sum/cuda/01_interleaved_divergent", kernels)
    assert row["kernels"] == 4  # 2^28 -> 2^20 -> 2^12 -> 16 -> 1
    assert row["gpu__time_duration.sum"] == sum(k["gpu__time_duration.sum"] for k in kernels) == 1182240.0
    pct = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
    assert min(k[pct] for k in kernels) <= row[pct] <= max(k[pct] for k in kernels)


def test_ncu_table_roundtrip(tmp_path, raw_steps):
    table = [ncu.combine(label, kernels) for label, kernels in raw_steps.items()]
    ncu.write_table(tmp_path / "ncu.csv", table)
    back = {r["label"]: r for r in ncu.read_table(tmp_path / "ncu.csv")}
    assert back["reduce_sum/triton/02_atomic"]["kernels"] == 2  # the zero-fill and the atomic kernel
    assert back["vector_add/cuda/01_naive"]["dram__bytes_read.sum"] == table[2]["dram__bytes_read.sum"]


# ---- tables ------------------------------------------------------------------------------------

def test_ladder_table_in_teaching_order(rows):
    table = tables.ladder_table(rows, "reduce_sum", "forward", "268435456", "float32")
    names = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert names[:3] == ["torch/eager", "torch/compile", "cub/device_reduce"]
    measured = {r["label"] for r in rows}  # the fixture's run: steps added since have no rows there
    assert names[3:] == [v.label.split("/", 1)[1] for v in rosetta.variants("reduce_sum") if v.label in measured]
    eager = next(line for line in table.splitlines() if line.startswith("| torch/eager"))
    assert "| 1.000x |" in eager


def test_ladder_table_delta_is_against_previous_step(rows):
    table = tables.ladder_table(rows, "vector_add", "forward", "268435456", "float32")
    by_name = {r["label"]: r for r in rows if r["role"] == "headline" and r["dtype"] == "float32"}
    s1, s2 = by_name["vector_add/cuda/01_naive"], by_name["vector_add/cuda/02_grid_stride"]
    expected = f"{s2['throughput'] / s1['throughput'] - 1:+.1%}"
    assert expected in next(line for line in table.splitlines() if "cuda/02_grid_stride" in line)


def test_wrong_step_is_reported_not_timed(rows):
    broken = [dict(r) for r in rows]
    for r in broken:
        if r["label"] == "vector_add/cuda/02_grid_stride":
            r.update(status="wrong", p50_ms=None, throughput=None)
    line = next(row for row in tables.ladder_table(broken, "vector_add", "forward", "268435456", "float32").splitlines() if "02_grid" in row)
    assert "| wrong |" in line


# ---- KERNEL_LOG --------------------------------------------------------------------------------

@pytest.fixture
def log_env(tmp_path, monkeypatch):
    """A scratch results folder and KERNEL_LOG (tests never write under results/)."""
    folder = tmp_path / "results" / "fixture-gpu"
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / "bench.csv", folder / "bench.csv")
    table = [ncu.combine(k, v) for k, v in ncu.read_raw(FIXTURES / "ncu_raw.csv").items()]
    ncu.write_table(folder / "ncu.csv", table)
    kernel_log = tmp_path / "KERNEL_LOG.md"
    monkeypatch.setattr(log, "LOG", kernel_log)
    return folder, kernel_log


def test_log_generation_is_idempotent_and_keeps_prose(log_env):
    folder, kernel_log = log_env
    kernel_log.write_text("# KERNEL_LOG\n\nHand-written intro.\n")
    assert log.update(folder)
    text = kernel_log.read_text()
    assert "Hand-written intro." in text
    assert text.count(log.PLACEHOLDER) == 2 * len(rosetta.variants())  # a prediction and a lesson each
    mine = text.replace(f"**Lesson.** {log.PLACEHOLDER}", "**Lesson.** Measured, then understood.", 1)
    kernel_log.write_text(mine)
    assert not log.update(folder)  # same data: nothing changes
    assert kernel_log.read_text() == mine


def test_log_orders_steps_and_fills_tables(log_env):
    folder, kernel_log = log_env
    kernel_log.write_text("# KERNEL_LOG\n")
    log.update(folder)
    text = kernel_log.read_text()
    positions = [text.index(f"### {v.label} ") for v in rosetta.variants()]
    assert positions == sorted(positions)
    block = text[text.index(markers.begin("vector_add/cuda/04_unrolled_blocks")):]
    assert "| forward | float32 |" in block and "| Δ vs step 3 |" in block and "DRAM bytes / minimal" in block


def test_order_steps_moves_a_late_step_with_its_prose():
    v3, v4 = rosetta.variants("vector_add", "cuda")[2:4]
    t1 = rosetta.variants("vector_add", "triton")[0]
    text = (f"# L\n\n## vector_add\n\nintro\n\n### {v3.label} — a\n\nprose 3\n\n"
            f"### {t1.label} — c\n\nprose t1\n\n### {v4.label} — b\n\nprose 4\n")
    ordered = log.order_steps(text, "vector_add")
    assert ordered.index("prose 3") < ordered.index("prose 4") < ordered.index("prose t1")
    assert log.order_steps(ordered, "vector_add") == ordered


def test_markers_replace_only_between_pairs():
    text = f"before\n{markers.block('x', 'old')}\nafter\n"
    new = markers.replace(text, "x", "new")
    assert new == f"before\n{markers.block('x', 'new')}\nafter\n"
    with pytest.raises(KeyError):
        markers.replace(text, "missing", "y")


# ---- plots -------------------------------------------------------------------------------------

def test_plots_are_made(tmp_path, rows, raw_steps):
    made = [plots.sweep_plot(rows, "vector_add", "forward", "float32", tmp_path / "s.png", 2982.0),
            plots.ladder_plot(rows, "reduce_sum", "forward", "268435456", "float32", tmp_path / "l.png", 2957.0),
            plots.ncu_plot([ncu.combine(k, v) for k, v in raw_steps.items()], "reduce_sum",
                           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %", tmp_path / "n.png")]
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_blocks_from_results(rows):
    folder = rosetta.registry.REPO / "results" / "nvidia-h100-80gb-hbm3"
    if not (folder / "bench.csv").exists():
        pytest.skip("no committed H100 results")
    blocks = report.readme_blocks(folder)
    assert {"vector_add/best", "reduce_sum/best", "suite", "overhead"} <= set(blocks)
    assert "| vector_add (GB/s) | torch | best library tier | best CUDA step | best Triton step |" in blocks["vector_add/best"]
    assert "(results/nvidia-h100-80gb-hbm3/vector_add.md)" in blocks["vector_add/best"]
    method = report.readme_blocks(folder, base=rosetta.registry.REPO / "bench")  # links from bench/METHOD.md
    assert "(../results/nvidia-h100-80gb-hbm3/vector_add.md)" in method["vector_add/best"]


def test_op_pages_hold_every_ladder_table():
    folder = rosetta.registry.REPO / "results" / "nvidia-h100-80gb-hbm3"
    if not (folder / "bench.csv").exists():
        pytest.skip("no committed H100 results")
    page = (folder / "softmax.md").read_text()
    assert page.count("## softmax forward,") == sum(len(h.dtypes) for h in SPECS["softmax"].headlines)
    assert "| cuda/05_row_on_chip |" in page and "](./plots/" in page


# ---- line counts -------------------------------------------------------------------------------

def test_line_count_cuda_known_file(tmp_path):
    src = tmp_path / "01_known.cu"
    src.write_text(
        "// a comment\n#include <x>\n\n"
        "__device__ float twice(float v) {\n  return 2 * v;  // why\n}\n\n"
        "template <typename T>\n__global__ void k(T* p, int n) {\n  int i = threadIdx.x;\n"
        "  if (i < n) p[i] = twice(p[i]);\n}\n\n"
        "void launch(float* p, int n) {\n  k<<<1, 32>>>(p, n);\n}\n")
    c = lines.count(src)
    assert (c.device_nloc, c.host_nloc) == (3 + 5, 1 + 3)  # twice + (template) k; #include + launch


def test_line_count_triton_known_file(tmp_path):
    src = tmp_path / "01_known.py"
    src.write_text(
        '"""Docstring: not code."""\nimport triton\n\n\n@triton.jit\ndef kernel(x_ptr, n):\n'
        "    # comment\n    pid = tl.program_id(0)\n    tl.store(x_ptr + pid, pid)\n\n\n"
        "def launch(x):\n    kernel[(1,)](x, 1)\n")
    c = lines.count(src)
    assert (c.device_nloc, c.host_nloc) == (4, 3)  # decorator + def + 2 statements; import + launch


def test_nsight_splits_one_process_kernels_by_marker():
    """One ncu process per op: the marker kernel before each case splits the kernel list, so a
    case that launches several kernels (a two-pass reduction) keeps all of them."""
    from rosetta.bench.profiling import nsight

    k = lambda name: {"Kernel Name": name}  # noqa: E731
    kernels = [k("rosetta_profile_marker"), k("pass1"), k("pass2"),
               k("rosetta_profile_marker"), k("softmax_kernel"),
               k("rosetta_profile_marker")]  # a case whose launch was not profiled: dropped
    cases = [{"label": "a"}, {"label": "b"}, {"label": "c"}]
    groups = nsight.split_by_marker(kernels, cases)
    assert [(c["label"], [x["Kernel Name"] for x in g]) for c, g in groups] == \
        [("a", ["pass1", "pass2"]), ("b", ["softmax_kernel"])]


def test_other_input_layouts_are_their_own_rows(tmp_path):
    """matmul's transposed-input groups: the library and the best step of each backend, every
    layout and the default in one group (timed in turns), in rows keyed apart from the ladder's
    (same label, dtype and shape), tabled against the default measured with them."""
    import torch

    from rosetta.bench.run.suite import plan
    from rosetta.ops import SPECS

    groups = [g for g in plan(["matmul"], quick=False) if g.role == "layout"]
    spec = SPECS["matmul"]
    assert all(g.layouts == (results.DEFAULT_LAYOUT, *spec.input_layouts) for g in groups)  # measured in turns
    assert len(groups) == sum(len(h.dtypes) for h in spec.layout_headlines)
    who = [s.label for s in subjects("matmul", role="layout", dtype=torch.bfloat16)]
    assert who == ["matmul/torch/eager", rosetta.best("matmul", "cuda", torch.bfloat16).label,
                   rosetta.best("matmul", "triton", torch.bfloat16).label]
    a, b = torch.randn(6, 4), torch.randn(4, 5)
    for name, make in spec.input_layouts.items():
        ta, tb = make(a, b)
        assert torch.equal(ta, a) and torch.equal(tb, b)  # same values ...
        assert (ta.stride() == (1, 6)) == ("a.t()" in name) and (tb.stride() == (1, 4)) == ("b.t()" in name)

    label, shape = who[1], "4096x4096x4096"
    common = dict(op="matmul", direction="forward", backend="cuda", step=13, name="x", label=label,
                  dtype="bfloat16", shape=shape, numel=1, metric="TFLOP/s", status="ok")
    rows = [{**common, "role": "headline", "layout": "", "p50_ms": 0.190},
            {**common, "role": "layout", "layout": "default", "p50_ms": 0.200},
            {**common, "role": "layout", "layout": "a.t()", "p50_ms": 0.210}]
    path = tmp_path / "bench.csv"
    results.write_rows(path, rows, replace_all=True)
    back = results.read_rows(path)
    assert sorted(r["layout"] for r in back) == ["", "a.t()", "default"]  # none overwrote another
    table = tables.layout_table(back, "matmul")  # against the default measured in turns with it
    assert f"| {label.split('/', 1)[1]} | bfloat16 | 4096x4096x4096 | 200.0 | 210.0, 1.05x |" in table


def test_a_step_whose_code_changed_after_the_run_is_named(tmp_path, monkeypatch):
    """Rows measured before a step's code changed are marked as such; an edit of the header (the
    prose above the code), of a comment line or of CUDA's indentation leaves the measured code,
    and no mark."""
    from types import SimpleNamespace

    (tmp_path / "environment.json").write_text('{"git_sha": "0123abcd"}')
    edited, reworded, recommented, reindented = rosetta.variants("vector_add", "cuda")[:4]
    then = {  # each file as the run's commit had it, from the code (past the header) it has now
        edited.source: lambda code: "/* header */static int the_code_as_it_was;\n" + code,
        reworded.source: lambda code: "/* older words */" + code,
        recommented.source: lambda code: "/* header */  // an older comment line\n" + code,
        reindented.source: lambda code: "/* header */" + code.replace("\n", "\n    "),
    }

    def git_show(cmd, **kwargs):
        source = cmd[-1].split(":", 1)[1]
        now = (rosetta.registry.REPO / source).read_text()
        if source not in then:
            return SimpleNamespace(returncode=0, stdout=now)
        return SimpleNamespace(returncode=0, stdout=then[source](now[now.index("*/") + 2:]))

    monkeypatch.setattr(results.subprocess, "run", git_show)
    results._source_at.cache_clear()
    assert results.changed_since_run(tmp_path, rosetta.variants("vector_add")) == {edited: "0123abcd"}
    block = log.step_block(edited, [], [], "0123abcd")
    assert "**Changed since the run:** the source (or a shared file it uses) differs from run 0123abcd's" in block


def test_a_shared_header_whose_code_changed_after_the_run_marks_every_step_that_includes_it(tmp_path, monkeypatch):
    """A CUDA step runs its shared headers' code too (hopper.cuh's tensor-map settings, say): a
    code edit there marks every step including it, directly or through another header, and no
    Triton step; a comment edit there marks none."""
    from types import SimpleNamespace

    (tmp_path / "environment.json").write_text('{"git_sha": "0123abcd"}')
    header = "cuda-kernels/common/rosetta.cuh"  # vector_add's steps include it through primitives.cuh too

    def run_with(older_header):
        def git_show(cmd, **kwargs):
            source = cmd[-1].split(":", 1)[1]
            now = (rosetta.registry.REPO / source).read_text()
            return SimpleNamespace(returncode=0, stdout=older_header(now) if source == header else now)

        monkeypatch.setattr(results.subprocess, "run", git_show)
        results._source_at.cache_clear()
        return list(results.changed_since_run(tmp_path, rosetta.variants("vector_add")))

    assert run_with(lambda now: now + "\nstatic int the_code_as_it_was;\n") == rosetta.variants("vector_add", "cuda")
    assert run_with(lambda now: "// an older comment line\n" + now) == []
    results._source_at.cache_clear()


def test_each_step_is_compared_with_the_run_that_measured_its_rows(tmp_path, monkeypatch):
    """bench.csv gathers runs: a step's rows are checked against their own run's code, not the
    latest run's; a Triton step also runs the shared modules it imports (common.py here)."""
    from types import SimpleNamespace

    (tmp_path / "environment.json").write_text('{"git_sha": "latest"}')
    first, second = rosetta.variants("vector_add", "triton")[:2]
    results.write_rows(tmp_path / "bench.csv", [
        dict(op="vector_add", direction="forward", backend="triton", step=v.step, name="x", label=v.label,
             dtype="float32", shape="1024", numel=1024, role="headline", layout="", status="ok", git_sha=sha)
        for v, sha in ((first, "older"), (second, "latest"))], replace_all=True)
    shared = "triton-kernels/common.py"
    assert "from rosetta.triton_kernels.common import" in (rosetta.registry.REPO / first.source).read_text()

    def git_show(cmd, **kwargs):  # common.py had other code at "older"; everything else is as now
        sha, source = cmd[-1].split(":", 1)
        now = (rosetta.registry.REPO / source).read_text()
        return SimpleNamespace(returncode=0, stdout=now + "\nTHE_CODE_AS_IT_WAS = 1\n" if (sha, source) == ("older", shared) else now)

    monkeypatch.setattr(results.subprocess, "run", git_show)
    results._source_at.cache_clear()
    assert results.changed_since_run(tmp_path, [first, second]) == {first: "older"}
    results._source_at.cache_clear()


# ---- timing in turns ---------------------------------------------------------------------------

def test_turns_visit_every_subject_once_a_round_in_changing_orders(monkeypatch):
    """measure_in_turns' rounds (no GPU: the timing primitives replaced by a recorder): every
    subject once per round, each with 1 / rounds of the reps, in an order that changes between
    rounds, so that no subject always follows the same one (the neighbour effect in KERNEL_LOG's
    "Timing in turns"); and a subject's placements taken in rotation, one a round."""
    from rosetta import timing

    visits = []
    monkeypatch.setattr(timing, "graph_or_calls", lambda fn: (fn, "graph"))
    estimated = []
    monkeypatch.setattr(timing, "estimate", lambda call, flush: estimated.append(call()) or 1.0)
    monkeypatch.setattr(timing, "replay_times", lambda call, flush, **kw: visits.append(call()) or [kw["rep_ms"]])
    placements = 3
    subjects = [[lambda i=i, p=p: (i, p) for p in range(placements)] for i in range(5)]
    rounds = 16
    measured = timing.measure_in_turns(subjects, None, rounds=rounds)
    orders = [[i for i, _ in visits[r * 5:(r + 1) * 5]] for r in range(rounds)]
    assert estimated == [(i, 0) for i in range(5)]  # once a subject: its placements do the same work
    assert len(visits) == 5 * rounds and all(sorted(o) == list(range(5)) for o in orders)
    assert all(p == r % placements for r in range(rounds) for _, p in visits[r * 5:(r + 1) * 5])
    assert all(m["reps"] == rounds and m["p50_ms"] == 100 / rounds for m in measured)
    predecessors = {i: {o[o.index(i) - 1] for o in orders if o.index(i) > 0} for i in range(5)}
    assert all(len(p) > 1 for p in predecessors.values())
    assert timing.measure_in_turns(subjects, None, rounds=rounds) and visits[-5 * rounds:] == visits[:5 * rounds]  # seeded


def test_plotted_ceiling_is_the_one_the_table_divides_by():
    """A library kernel measured above the survey's probe raises a table's ceiling; the plot's line
    is read back from the rows, so it cannot sit below a bar that the table puts at 100%."""
    rows = [{"throughput": None, "pct_of_ceiling": None},
            {"throughput": 768.0, "pct_of_ceiling": 100.0}, {"throughput": 759.0, "pct_of_ceiling": 98.8}]
    assert report.table_ceiling(rows) == pytest.approx(768.0)
    assert report.table_ceiling([{"throughput": 1.0, "pct_of_ceiling": None}]) is None


def test_placements_shrink_with_the_calls_memory():
    """A turn keeps every placement's graph alive (its output and its call's temporaries): a call
    that holds a quarter of the budget takes PLACEMENTS outputs, a large one fewer, a call larger
    than the whole budget still one (the unfused attention formula's 24 GiB of scores)."""
    gib = 2**30
    budget = 18 * gib
    assert placements_that_fit(gib, budget) == PLACEMENTS
    assert placements_that_fit(5 * gib, budget) == 3
    assert placements_that_fit(24 * gib, budget) == 1
    assert placements_that_fit(0, budget) == PLACEMENTS  # an empty output and no temporaries


def test_overhead_table_gives_each_call_its_step_and_multiple_of_torch():
    def row(backend, name, us):
        return {"op": "softmax", "backend": backend, "name": name, "dtype": "float32", "shape": "8x1000",
                "p50_ms": us / 1e3}

    table = report.overhead_table([row("torch", "call", 8.0), row("cuda", "call (step 5)", 12.0),
                            row("triton", "call (step 1)", 20.0), row("triton", "raw launch", 9.0),
                            row("torch", "call, requires_grad", 10.0), row("cuda", "call, requires_grad", 25.0)])
    line = table.splitlines()[2]
    assert line == ("| softmax | float32 8x1000 | 8.0 | 12.0 (step 5, 1.5x torch) | 20.0 (step 1, 2.5x torch) "
                    "| 10.0 | 25.0 (2.5x torch) | - |")


def test_host_cost_layers_are_timed_in_turns(monkeypatch):
    """bench --overhead: every layer of an input once a round, in order, the median round kept, so
    torch's call and each layer of ours see the same moments of the host."""
    from rosetta.bench.run import overhead

    monkeypatch.setattr(overhead.torch.cuda, "synchronize", lambda: None)
    order = []
    times = overhead.host_us_in_turns([lambda: order.append("torch"), lambda: order.append("ours")],
                                      calls_=3, rounds=4)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert order[40:] == (["torch"] * 3 + ["ours"] * 3) * 4  # after 20 warm-up calls each


def test_host_cost_reports_the_pass_after_a_discarded_one(monkeypatch, tmp_path):
    """bench --overhead: every case's layers are timed in one set of turns, twice; the first pass
    (a fresh process ran it 1.3-1.6x slower) is thrown away and the second is the table."""
    from rosetta.bench.run import overhead

    passes = []

    def fake_turns(fns, calls_=overhead.CALLS, rounds=overhead.ROUNDS):
        passes.append(len(fns))
        return [float(len(passes))] * len(fns)

    monkeypatch.setattr(overhead, "host_us_in_turns", fake_turns)
    monkeypatch.setattr(overhead, "CASES", overhead.CASES[:2])
    monkeypatch.setattr(overhead, "layers", lambda op, shape, dtype, gen: [("torch", "call", None), ("cuda", "raw launch", None)])
    table = overhead.run(None, {"git_sha": "abc", "gpu": "a GPU"}, tmp_path)
    assert passes == [4, 4]  # both cases' layers in each pass, two passes
    assert all(line.endswith("| 2.0 |") for line in table.splitlines()[2:])
