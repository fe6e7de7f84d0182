"""`--shard I/N` (conftest.py): N runs of `make test-gpu` that together run each selected test once."""
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def collected(*args: str) -> tuple[list[str], str]:
    """The test ids pytest would run for tests/test_registry.py with these options, and its output."""
    run = subprocess.run([sys.executable, "-m", "pytest", str(TESTS / "test_registry.py"), "--collect-only", "-q",
                          "-p", "no:cacheprovider", *args], capture_output=True, text=True, cwd=TESTS.parent)
    return [line for line in run.stdout.splitlines() if "::" in line], run.stdout + run.stderr


def test_shards_partition_the_selection_after_k():
    selected, _ = collected("-k", "not every_step_file")
    shards = [collected("-k", "not every_step_file", "--shard", f"{i}/3")[0] for i in (1, 2, 3)]
    assert len(selected) > 3
    assert sorted(sum(shards, [])) == sorted(selected)  # every selected test once, none twice
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # even, counted after -k


def test_bad_shard_is_a_usage_error():
    for spec in ("4/3", "0/2", "two"):
        ids, output = collected("--shard", spec)
        assert not ids and "--shard" in output, spec
