"""The registry is the one source of truth: every step file is in it, and it is well formed."""
import pytest

import rosetta
from rosetta import registry
from rosetta.ops import SPECS


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
    assert rosetta.OPS == ("vector_add", "reduce_sum", "softmax", "matmul")
    keys = [(rosetta.OPS.index(v.op), rosetta.BACKENDS.index(v.backend), v.step) for v in rosetta.variants()]
    assert keys == sorted(keys)


@pytest.mark.parametrize("op", [op for op in rosetta.OPS if rosetta.variants(op)])
@pytest.mark.parametrize("backend", rosetta.BACKENDS)
def test_steps_are_contiguous_and_best_is_last(op, backend):
    ladder = rosetta.variants(op, backend)
    assert ladder, f"{op} has no {backend} ladder"
    assert [v.step for v in ladder] == list(range(1, len(ladder) + 1))
    assert rosetta.best(op, backend) is ladder[-1]


@pytest.mark.parametrize("v", rosetta.variants(), ids=lambda v: v.label)
def test_variant_fields(v):
    assert (registry.REPO / v.source).is_file()
    assert v.op in SPECS and v.dtypes == SPECS[v.op].dtypes
    assert v.source.endswith(f"{v.step:02d}_{v.name}{registry.SUFFIXES[v.backend]}")
    for field in ("title", "changed", "why", "still", "limits"):
        assert len(getattr(v.header, field)) > 3, f"{v.source}: empty {field}"


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
    step, header = registry.parse_header(f)
    assert step == 2 and header.title == "two words" and header.changed == "first second"
