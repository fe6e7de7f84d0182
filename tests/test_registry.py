"""The registry is the one source of truth: every step file is in it, and it is well formed."""
import re

import pytest
import torch

import rosetta
from rosetta import steps as registry
from rosetta.bench import lines
from rosetta.ops import SPECS
from rosetta.ops.spec import LAYOUTS


def all_step_files():
    """Every kernel file laid out as a step, found independently of the registry's own walk."""
    found = []
    for backend, folder in registry.KERNEL_DIRS.items():
        for path in folder.glob(f"*/*{registry.SUFFIXES[backend]}"):
            if path.stem[:2].isdigit():
                found.append(str(path.relative_to(registry.REPO)))
    return sorted(found)


def test_every_step_file_is_registered():
    assert sorted(v.source for v in rosetta.variants()) == all_step_files()


def test_ops_and_order():
    assert rosetta.OPS == ("vector_add", "reduce_sum", "softmax", "matmul", "rms_norm", "layer_norm", "dropout",
                           "linear_gelu", "attention")
    keys = [(rosetta.OPS.index(v.op), rosetta.BACKENDS.index(v.backend), v.step) for v in rosetta.variants()]
    assert keys == sorted(keys)


@pytest.mark.parametrize("op", [op for op in rosetta.OPS if rosetta.variants(op)])
@pytest.mark.parametrize("backend", rosetta.BACKENDS)
def test_steps_are_contiguous_and_best_is_the_last_without_a_hazard(op, backend):
    ladder = rosetta.variants(op, backend)
    assert ladder, f"{op} has no {backend} ladder"
    assert [v.step for v in ladder] == list(range(1, len(ladder) + 1))
    safe = [v for v in ladder if not v.hazard and not v.slower]
    assert rosetta.best(op, backend) is safe[-1]
    for dtype in {d for v in ladder for d in v.dtypes}:
        assert rosetta.best(op, backend, dtype) is [v for v in safe if dtype in v.dtypes][-1]
    for v in ladder:
        assert rosetta.select(op, backend, v.step) is v  # a hazard does not hide a step asked for


def test_a_declared_hazard_keeps_step_none_off_the_step():
    """Triton matmul step 6 (warp_specialize) leaves tiles unwritten when preempted; step=None
    passes it over: to the later steps where they take the inputs (9, the last, below two waves of
    tiles), else back to step 5, which takes the same layouts as step 6."""
    six = rosetta.select("matmul", "triton", 6)
    assert "preempt" in six.hazard
    assert rosetta.best("matmul", "triton", torch.bfloat16).step == 9
    mid = (torch.ones(64, 64, dtype=torch.bfloat16), torch.ones(64, 64, dtype=torch.bfloat16))
    assert rosetta.best("matmul", "triton", torch.bfloat16, mid).step == 9  # the last step that takes it
    big = (torch.ones(2048, 64, dtype=torch.bfloat16), torch.ones(64, 4096, dtype=torch.bfloat16))
    assert rosetta.best("matmul", "triton", torch.bfloat16, big).step == 5  # past steps 7 and 9's output_tiles


@pytest.mark.parametrize("v", rosetta.variants(), ids=lambda v: v.label)
def test_variant_fields(v):
    assert (registry.REPO / v.source).is_file()
    assert v.op in SPECS and v.dtypes and set(v.dtypes) <= set(SPECS[v.op].dtypes)
    assert v.layout in LAYOUTS
    assert v.source.endswith(f"{v.step:02d}_{v.name}{registry.SUFFIXES[v.backend]}")
    for field in ("title", "changed", "why", "still", "limits"):
        assert len(getattr(v.header, field)) > 3, f"{v.source}: empty {field}"


@pytest.mark.parametrize("v", rosetta.variants(), ids=lambda v: v.label)
def test_every_step_file_holds_its_kernels(v):
    """A step's kernels live in its own file, not in a shared header, so the file a reader opens
    shows the idea (and its line count counts it); or the step launches an earlier step's kernel
    and says which in code (Triton matmul 4: step 3's kernel, autotuned)."""
    text = (registry.REPO / v.source).read_text()
    reused = re.search(rf'select\("{v.op}", "{v.backend}", (\d+)\)', text)
    assert lines.count(registry.REPO / v.source).device_nloc > 0 or (reused and int(reused[1]) < v.step), \
        f"{v.source} holds no kernel and names no earlier step whose kernel it launches"


def test_qualnames_are_unique():
    names = [v.qualname for v in rosetta.variants()]
    assert len(names) == len(set(names))


def test_header_parser_rejects_incomplete_headers(tmp_path):
    bad = tmp_path / "01_bad.cu"
    bad.write_text("/*\nStep 1 — x\nChanged: a\nWhy: b\n*/\n")
    with pytest.raises(registry.RegistryError, match="Still, Limits"):
        registry.parse_header(bad)
    untitled = tmp_path / "01_untitled.py"
    untitled.write_text('"""Changed: a"""\n')
    with pytest.raises(registry.RegistryError, match="Step N"):
        registry.parse_header(untitled)


def test_header_continuation_lines_are_joined(tmp_path):
    f = tmp_path / "02_two.py"
    f.write_text('"""\nStep 2 — two words\nChanged:  first\n          second\nWhy: w\nStill: s\nLimits: none\n"""\n')
    step, fields = registry.parse_header(f)
    assert step == 2 and fields["title"] == "two words" and fields["Changed"] == "first second"


def test_optional_header_lines_declare_what_a_step_takes(tmp_path):
    """Dtypes, Layout and Max are declared once, in the step's own file."""
    f = tmp_path / "01_x.py"
    f.write_text('"""\nStep 1 — x\nChanged: a\nWhy: b\nStill: c\nLimits: d\nDtypes: float32, bfloat16\n'
                 'Layout: any\nMax: cols <= 65,536\n"""\n')
    _, fields = registry.parse_header(f)
    spec = SPECS["softmax"]
    assert registry._dtypes(f, fields["Dtypes"], spec.dtypes) == (torch.float32, torch.bfloat16)
    assert registry._bounds(f, fields["Max"], spec) == (("cols", 65536),)
    with pytest.raises(registry.RegistryError, match="Dtypes names 'float64'"):
        registry._dtypes(f, "float64", spec.dtypes)
    with pytest.raises(registry.RegistryError, match="Max must read"):
        registry._bounds(f, "rows < 3", spec)


def test_an_op_with_steps_but_no_spec_fails_loudly(tmp_path, monkeypatch):
    folder = tmp_path / "cuda-kernels" / "transpose"
    folder.mkdir(parents=True)
    (folder / "01_naive.cu").write_text("/*\nStep 1 — n\nChanged: a\nWhy: b\nStill: c\nLimits: d\n*/\n")
    monkeypatch.setitem(registry.KERNEL_DIRS, "cuda", tmp_path / "cuda-kernels")
    with pytest.raises(registry.RegistryError, match="op 'transpose' has steps but no spec"):
        registry.discover()


@pytest.mark.parametrize("op", rosetta.ops_with_steps())
def test_every_op_with_steps_has_test_cases(op):
    """An op with steps but no test shapes would be tested vacuously: fail instead."""
    spec = SPECS[op]
    assert spec.test_shapes and spec.cpu_shapes, f"{op} has steps but no test shapes in its spec"


@pytest.mark.parametrize("v", rosetta.variants(), ids=lambda v: v.label)
def test_predictions_live_in_the_kernel_log_not_the_header(v):
    """One home for a step's prediction (KERNEL_LOG's **Prediction.**, written before measuring):
    a second copy in the header drifts from the first."""
    assert "Prediction:" not in (registry.REPO / v.source).read_text()[:4000], \
        f"{v.source}: move the header's prediction to KERNEL_LOG.md"


def test_a_step_declared_slower_is_passed_over_without_a_table():
    """linear_gelu CUDA step 3 (ping-pong) measured slower than step 2 on every H100 shape: with no
    measured table (CPU tensors, another GPU) step=None takes step 2; by number it runs."""
    three = rosetta.select("linear_gelu", "cuda", 3)
    assert "step 2" in three.slower
    inputs = (torch.ones(64, 32, dtype=torch.bfloat16), torch.ones(32, 48, dtype=torch.bfloat16),
              torch.ones(48, dtype=torch.bfloat16))
    assert rosetta.best("linear_gelu", "cuda", torch.bfloat16, inputs).step == 2
    assert "step 3 after it, declared slower, passed over" in str(rosetta.explain("linear_gelu", *inputs, backend="cuda"))
    assert rosetta.select("linear_gelu", "cuda", 3, torch.bfloat16, inputs) is three
    from rosetta.bench.docs import log, site_step
    assert f"- **Slower:** {three.slower}" in log.step_block(three, [], [])
    assert "<dt>Slower</dt>" in site_step.header_html(three)


def test_a_hazard_is_shown_wherever_the_step_header_is():
    """KERNEL_LOG's step block and the report's step page carry the Hazard line."""
    from rosetta.bench.docs import log, site_step
    six = rosetta.select("matmul", "triton", 6)
    assert f"- **Hazard:** {six.hazard}" in log.step_block(six, [], [])
    assert "<dt>Hazard</dt>" in site_step.header_html(six)
    assert "Hazard" not in site_step.header_html(rosetta.select("matmul", "triton", 5))


def test_sweep_tiers_name_the_ops_own_tiers():
    """A spec's sweep_tiers are names of its tiers: a misspelt one would drop a line from the sweep."""
    from rosetta.bench.run.tiers import tiers

    for spec in SPECS.values():
        if spec.sweep_tiers is not None:
            assert set(spec.sweep_tiers) <= {t.name for t in tiers(spec.name)}, spec.name
