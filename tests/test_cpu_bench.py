"""`make bench` on a machine with no GPU runs its CPU part end to end and means it: every Triton
step checked against fp64 on shapes it computes, nothing "passing" on an empty problem."""
import os
import subprocess
import sys

import pytest
import torch

import rosetta

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU part runs where there is no GPU")


def bench(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the bench sets it itself
    return subprocess.run([sys.executable, "-m", "rosetta.bench", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_cpu_bench_checks_every_triton_step():
    run = bench()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    for v in rosetta.variants(backend="triton"):
        mine = [line for line in lines if line.split()[:2] in ([v.label, "forward"], [v.label, "backward"])]
        assert mine and all(line.endswith(" ok") for line in mine), f"{v.label}: {mine}"
    assert "not checked" not in run.stdout and "WRONG" not in run.stdout
    assert "RuntimeWarning" not in run.stderr


def test_cpu_bench_honours_backend_and_step():
    run = bench("--op", "softmax", "--backend", "triton", "--step", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    checked = {line.split()[0] for line in run.stdout.splitlines() if line.strip().endswith(" ok")}
    assert checked == {"softmax/triton/02_online"}
    cuda = bench("--op", "vector_add", "--backend", "cuda")
    assert cuda.returncode == 0 and "need one" in cuda.stdout and "/triton/" not in cuda.stdout


def test_changed_selects_the_ops_whose_steps_changed_since_their_rows_run(monkeypatch, capsys):
    """--changed re-runs whole ops, those with a step that changed since the run behind its rows,
    and says which steps and runs; with none changed it says so and runs nothing."""
    from rosetta.bench import __main__ as cli
    from rosetta.bench import results

    step = rosetta.variants("dropout", "triton")[0]
    monkeypatch.setattr(results, "changed_since_run", lambda folder, variants: {step: "0123abcd"})
    assert cli.changed_ops() == ["dropout"]
    assert cli.changed_ops(["matmul"]) == []
    assert f"dropout: changed since their rows' run: {step.label} (0123abcd)" in capsys.readouterr().out
    monkeypatch.setattr(results, "changed_since_run", lambda folder, variants: {})
    assert cli.main(["--changed"]) == 0
    assert "nothing to re-run" in capsys.readouterr().out
