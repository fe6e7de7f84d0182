"""hardware-survey on recorded H100 data: peak arithmetic (exact), the roofline from recorded
results, the ceilings the bench divides by, and the hardware.md rendering."""
import json
from pathlib import Path

import pytest

from rosetta.bench import ceilings, results
from rosetta.survey import facts, roofline
from rosetta.survey.__main__ import markdown

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def hardware():
    return json.loads((FIXTURES / "hardware.json").read_text())


def test_theoretical_peaks_from_recorded_facts(hardware):
    peaks = facts.theoretical_peaks(hardware["facts"])
    # H100 SXM: HBM3 at 2619 MHz (double data rate) on a 5120-bit bus; 132 SMs x 128 FP32 lanes
    assert peaks["dram_gbps"]["value"] == 2 * 2619e6 * 5120 / 8 / 1e9 == 3352.32
    assert peaks["fp32_fma_tflops"]["value"] == pytest.approx(132 * 128 * 2 * 1980e6 / 1e12)
    assert facts.fp32_peak_at(hardware["facts"], 1755.0) == pytest.approx(132 * 128 * 2 * 1755e6 / 1e12)


def test_recorded_acceptance_numbers(hardware):
    m = hardware["measured"]
    assert abs(m["dram_copy_own"]["vs_torch"] - 1) <= 0.05  # own copy within 5% of torch's
    assert m["fp32_fma"]["pct_of_peak_at_measured_clock"] >= 85
    assert hardware["facts"]["torch_agrees"]


def test_roofline_points_from_recorded_results(tmp_path, hardware):
    rows = results.read_rows(FIXTURES / "bench.csv")
    points = {p["label"]: p for p in roofline.points(rows)}
    add, red = points["vector_add/cuda/04_unrolled_blocks"], points["reduce_sum/cuda/10_deep_loads"]
    assert add["intensity"] == pytest.approx(1 / 12) and red["intensity"] == pytest.approx(1 / 4)
    row = next(r for r in rows if r["label"] == "reduce_sum/cuda/10_deep_loads"
               and r["role"] == "headline" and r["dtype"] == "float32")
    assert red["tflops"] == pytest.approx(2**28 / (row["p50_ms"] * 1e-3) / 1e12)
    assert {p["backend"] for p in points.values()} == {"torch", "cub", "cuda", "triton"}
    path = roofline.plot(hardware, rows, tmp_path / "roofline.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_bench_ceilings_read_the_survey(tmp_path, hardware):
    (tmp_path / "hardware.json").write_text(json.dumps(hardware))
    limits = ceilings.load(tmp_path)
    assert limits["source"] == "measured"
    assert limits["dram_copy"] == hardware["measured"]["dram_copy_own"]["median"]
    assert limits["dram_read"] == hardware["measured"]["dram_read"]["median"]


def test_bench_ceilings_fall_back_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="theoretical peaks"):
        limits = ceilings.load(tmp_path)
    assert limits["source"] == "theoretical"


def test_hardware_markdown(hardware):
    text = markdown(hardware)
    assert "| dram_copy_own |" in text and "| fp32_fma |" in text and "2 (DDR) x 2619.0 MHz" in text
