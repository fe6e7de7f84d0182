"""The claims page (bench/docs/claims.py, bench/docs/site_claims.py) on small synthetic rows: a claim that holds,
one that does not, one that depends, a missing tier; the tiers the claims need (torch/unfused and
the BLOCK=4 ablation) on the CPU; and the built site's claims.html covering every claim."""
from __future__ import annotations

import html
import os
import shutil
import subprocess

import pytest
import torch

from rosetta.bench import results
from rosetta.bench.docs import claims, site, tables
from rosetta.bench.docs.report import reference_results
from rosetta.bench.run.tiers import runner, tiers
from rosetta.ops import SPECS
from test_site import parse

MATMUL_BF16 = ("forward", "4096x4096x4096", "bfloat16")
MATMUL_FP32 = ("forward", "4096x4096x4096", "float32")


def row(label: str, case: tuple, throughput: float, status: str = "ok", **extra) -> dict:
    """One headline row as results.read_rows returns it."""
    op, backend, name = label.split("/")
    direction, shape, dtype = case
    r = dict.fromkeys(results.COLUMNS)
    r.update(op=op, backend=backend, name=name, label=label, direction=direction, shape=shape, dtype=dtype,
             role="headline", status=status, metric=SPECS[op].metric,
             throughput=throughput if status == "ok" else None, p50_ms=1.0 if status == "ok" else None, **extra)
    return r


def grouped(ratio: float, case=MATMUL_BF16) -> list[dict]:
    return [row("matmul/triton/02_tl_dot", case, 500.0), row("matmul/triton/03_grouped", case, 500.0 * ratio)]


# ---- verdicts on synthetic rows ------------------------------------------------------------------

def test_claim_holds_when_every_case_is_in_its_band():
    c = claims.grouped_order(grouped(1.11))
    assert c.verdict.word == claims.HOLDS and str(c.verdict) == "holds"
    (evidence,) = c.parts[0].evidence
    assert evidence.value == pytest.approx(1.11)
    assert [s.label for s in evidence.sources] == ["matmul/triton/03_grouped", "matmul/triton/02_tl_dot"]
    assert (evidence.sources[0].dtype, evidence.sources[0].shape) == ("bfloat16", "4096x4096x4096")


def test_claim_does_not_hold_when_no_case_is_in_its_band():
    c = claims.grouped_order(grouped(1.0) + grouped(0.98, MATMUL_FP32))
    assert str(c.verdict) == "does not hold"
    assert "all 2 cases below the band" in c.verdict.detail


def test_claim_depends_on_the_attribute_that_splits_the_cases():
    c = claims.grouped_order(grouped(1.11) + grouped(1.0, MATMUL_FP32))
    assert str(c.verdict) == "depends (on the dtype)"
    assert "within the band: dtype bfloat16" in c.verdict.detail and "below the band: dtype float32" in c.verdict.detail


def test_band_widens_by_slack_only_for_a_tilde():
    assert claims.about(3, 4) == claims.Band(3 * (1 - claims.SLACK), 4 * (1 + claims.SLACK))
    assert [claims.Band(0.85, 0.95).place(v) for v in (0.8, 0.9, 1.0)] == ["below", "within", "above"]


def test_missing_tier_is_not_measured_and_never_judged():
    case = ("forward", "4096x4096", "float32")
    rows = [row("softmax/triton/01_fused_row", case, 3000.0), row("softmax/torch/eager", case, 1500.0)]
    c = claims.fused_softmax(rows)
    assert str(c.verdict) == "not measured in the committed run (tier torch/unfused added to the bench)"
    context = {p.name: p.summary() for p in c.parts if p.band is None}
    assert context["best Triton / torch/eager (torch.softmax)"] == "2.00x"  # context is still shown
    # a tier row that ran but failed the gate is named, and still measures nothing
    wrong = row("softmax/torch/unfused", ("forward", "4096x4096", "bfloat16"), 0, status="wrong", error=0.04)
    c = claims.fused_softmax(rows + [wrong])
    assert c.verdict.word == claims.UNMEASURED and "bfloat16 4096x4096: wrong (error 0.04)" in c.notes[0]
    # once measured, the claim is judged
    c = claims.fused_softmax(rows + [row("softmax/torch/unfused", case, 850.0)])
    assert str(c.verdict) == "holds"


def test_block4_claim_waits_for_the_ablation_tier():
    case = ("forward", "268435456", "float32")
    rows = [row("vector_add/triton/02_autotuned", case, 3100.0)]
    assert str(claims.tiny_block(rows).verdict).endswith("(tier ablation/triton_01_block4 added to the bench)")
    c = claims.tiny_block(rows + [row("vector_add/ablation/triton_01_block4", case, 3100.0 / 20)])
    assert str(c.verdict) == "does not hold" and "above" not in c.verdict.detail


def test_markdown_summary_has_one_line_per_claim():
    lines = claims.markdown_summary([]).splitlines()
    assert lines[:2] == ["| claim | our number | verdict |", "|---|---|---|"]
    assert len(lines) == 2 + len(claims.CLAIMS) == 9
    verdicts = [line.rsplit("|", 2)[1].strip() for line in lines[2:]]
    assert all(v.startswith(claims.UNMEASURED) for v in verdicts[:-1])  # no rows: nothing measured
    assert not verdicts[-1].startswith(claims.UNMEASURED)  # but line counts come from the sources


# ---- the tiers the claims need ------------------------------------------------------------------

def test_unfused_softmax_tier_is_forward_only_and_right_in_fp32():
    (unfused,) = [t for t in tiers("softmax") if t.name == "unfused"]
    assert unfused.label == "softmax/torch/unfused"
    assert unfused.takes("forward") and not unfused.takes("backward")
    for op, spec in SPECS.items():  # an unfused tier exactly where a direction writes the op unfused
        assert any(t.name == "unfused" for t in tiers(op)) == any(d.torch_unfused for d in spec.directions().values())
    d = SPECS["softmax"].forward
    x = d.make_inputs((8, 1025), torch.float32, "cpu", torch.Generator().manual_seed(0))
    out = d.allocate(*x)
    fn, copied = runner(unfused, "forward", x, out)
    assert fn() is out and copied == []
    assert d.error(out, d.reference(*x), x) <= d.tolerance[torch.float32]


def test_torch_tiers_sort_in_declared_order():
    case = ("forward", "4096x4096", "float32")
    names = ["unfused", "compile", "eager"]
    ordered = sorted((row(f"softmax/torch/{n}", case, 1.0) | {"step": 0, "numel": 1} for n in names),
                     key=results.order_key)
    assert [r["name"] for r in ordered] == ["eager", "compile", "unfused"]
    assert [line.split("|")[1].strip() for line in tables.ladder_table(ordered, "softmax", *case).splitlines()[2:]] \
        == ["torch/eager", "torch/compile", "torch/unfused"]


def test_block4_ablation_runs_step_one_at_block_4(interpreter):
    (block4,) = [t for t in tiers("vector_add") if t.ablation]
    assert block4.label == "vector_add/ablation/triton_01_block4"
    assert block4.ablation.variant.label == "vector_add/triton/01_block" and not block4.takes("backward")
    d = SPECS["vector_add"].forward
    inputs = d.make_inputs((1001,), torch.float32, "cpu", torch.Generator().manual_seed(0))
    fn, _ = runner(block4, "forward", inputs, d.allocate(*inputs).fill_(float("nan")))
    assert d.error(fn(), d.reference(*inputs), inputs) == 0


# ---- the built page ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if reference_results() is None:
        pytest.skip("no committed results/*/bench.csv to build the site from")
    out = tmp_path_factory.mktemp("site")
    site.build(out)
    return out


def test_site_has_a_claims_page_covering_every_claim(built):
    page = parse(built / "claims.html")
    assert not page.errors and not page.stack, page.errors[:5]
    text = (built / "claims.html").read_text()
    rows = results.read_rows(reference_results() / "bench.csv")
    for c in claims.claims(rows):
        assert f"claim-{c.number}" in page.ids and html.escape(c.text) in text
        assert html.escape(str(c.verdict)) in text
    assert {f"claim-{n}" for n in range(1, 8)} <= page.ids
    for target in page.links:
        file, _, fragment = target.partition("#")
        assert (built / (file or "claims.html")).is_file(), target
        assert not fragment or fragment in page.ids, target
    assert 'href="claims.html"' in (built / "index.html").read_text()


def test_browser_renders_every_claim(built, tmp_path):
    """Chromium builds the page's DOM with every claim's heading and verdict."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if os.environ.get("ROSETTA_NO_BROWSER") == "1" or browser is None:
        pytest.skip("no headless browser here (or ROSETTA_NO_BROWSER=1)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
                          "--dump-dom", (built / "claims.html").resolve().as_uri()],
                         capture_output=True, text=True, timeout=60).stdout
    assert "</html>" in dom
    for c in claims.claims(results.read_rows(reference_results() / "bench.csv")):
        assert html.escape(f"{c.number}. {c.text}", quote=False) in dom
        assert html.escape(str(c.verdict), quote=False) in dom
