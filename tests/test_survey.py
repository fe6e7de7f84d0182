"""hardware-survey on recorded H100 data: the ceiling selection (best probe wins), the theoretical
peak arithmetic, the bench's ceiling_for, hardware.md, and the roofline (every point at its true
arithmetic intensity, labels clear of each other)."""
import copy
import json
from pathlib import Path

import pytest
from matplotlib.text import Text

from rosetta.bench import ceilings, results
from rosetta.survey import best, facts, roofline
from rosetta.survey.report import markdown

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def hardware():
    return json.loads((FIXTURES / "hardware.json").read_text())


def test_each_ceiling_is_its_best_probe(hardware):
    chosen = best.ceilings(hardware)
    for name, c in chosen.items():
        rates = {p: r["value"] for p, r in hardware["probes"].items() if r["ceiling"] == name and best.ok(r)}
        assert rates, f"the recorded survey has no probe for {name}"
        assert c["value"] == max(rates.values()) and rates[c["probe"]] == c["value"]
        assert all(c["value"] >= v for v in rates.values()), f"{name} is below one of its probes"
    # the read+write ceiling is the best of several kinds of probe, not the own kernel by fiat
    assert {p for p, r in hardware["probes"].items() if r["ceiling"] == "dram_copy"} >= \
        {"copy_own", "copy_torch", "memcpy_d2d", "add_torch"}
    assert "mma_sync_bfloat16" in hardware["probes"] and "cublas_float32_4096" in hardware["probes"]


def test_a_faster_probe_wins_and_a_failed_one_never_counts(hardware):
    hw = copy.deepcopy(hardware)
    top = best.ceilings(hw)["dram_read"]["value"]
    hw["probes"]["new_read"] = {"ceiling": "dram_read", "status": "ok", "value": top * 1.01, "unit": "GB/s"}
    hw["probes"]["broken"] = {"ceiling": "dram_read", "status": "failed: RuntimeError: boom", "value": top * 9}
    hw["probes"]["nan"] = {"ceiling": "dram_read", "status": "ok", "value": float("nan"), "unit": "GB/s"}
    c = best.ceilings(hw)["dram_read"]
    assert c["probe"] == "new_read" and c["value"] == top * 1.01
    for p in hw["probes"].values():
        if p["ceiling"] == "dram_read":
            p["status"] = "failed: x"
    assert best.ceilings(hw)["dram_read"]["value"] is None  # no probe ran: no ceiling, not zero


def test_theoretical_peaks_from_recorded_facts(hardware):
    f = hardware["facts"]
    peaks = facts.theoretical_peaks(f)
    # H100 SXM: HBM3 at 2619 MHz (double data rate) on a 5120-bit bus; 132 SMs x 128 FP32 lanes
    assert peaks["dram"]["value"] == 2 * 2619e6 * 5120 / 8 / 1e9 == 3352.32
    assert peaks["fp32_fma"]["value"] == pytest.approx(132 * 128 * 2 * 1980e6 / 1e12)
    assert facts.fp32_peak_at(f, 1755.0) == pytest.approx(132 * 128 * 2 * 1755e6 / 1e12)
    # dense bf16: 4096 flop/clk/SM (989.4 TFLOP/s at 1830 MHz in the whitepaper), at the max clock read
    assert 132 * 4096 * 1830e6 / 1e12 == pytest.approx(989.4, abs=0.1)
    assert peaks["tensor.bfloat16"]["value"] == pytest.approx(132 * 4096 * 1980e6 / 1e12)
    assert peaks["tensor.float16"]["value"] == peaks["tensor.bfloat16"]["value"] == 2 * peaks["tensor.tf32"]["value"]


@pytest.mark.parametrize("cc,lanes", [("6.0", 64), ("7.0", 64), ("7.5", 64), ("8.0", 64), ("8.6", 128),
                                      ("8.7", 128), ("8.9", 128), ("9.0", 128), ("10.0", 128), ("12.0", 128),
                                      ("10.1", 128), ("99.0", None)])
def test_fp32_lanes_per_sm_by_major_and_minor(cc, lanes):
    assert facts.fp32_lanes_per_sm(cc) == lanes


def test_a_known_gpu_without_tensor_figures_gets_none_not_a_guess():
    rtx4090 = {"compute_capability": "8.9", "sm_count": 128, "max_sm_clock_mhz": 2520.0,
               "memory_clock_mhz": 10501.0, "memory_bus_width_bits": 384}
    peaks = facts.theoretical_peaks(rtx4090)
    assert peaks["fp32_fma"]["value"] == pytest.approx(128 * 128 * 2 * 2520e6 / 1e12)  # 82.6 TFLOP/s
    assert peaks["tensor.bfloat16"]["value"] is None
    a100 = {"compute_capability": "8.0", "sm_count": 108, "max_sm_clock_mhz": 1410.0}
    assert facts.tensor_peak_tflops(a100, "bfloat16") == pytest.approx(311.9, abs=0.1)


def test_ceiling_for(tmp_path, hardware):
    (tmp_path / "hardware.json").write_text(json.dumps(hardware))
    limits = ceilings.load(tmp_path)
    c = best.ceilings(hardware)
    assert limits["source"] == "measured"
    for spec_ceiling in ("dram_copy", "dram_read"):  # bandwidth: the dtype does not matter
        for dtype in ("float32", "bfloat16"):
            assert ceilings.ceiling_for(limits, spec_ceiling, dtype) == (c[spec_ceiling]["value"], 3352.32)
    # matmul's spec says "fp32_fma": fp32 against the FMA ceiling, half types against tensor cores
    assert ceilings.ceiling_for(limits, "fp32_fma", "float32") == (c["fp32_fma"]["value"], c["fp32_fma"]["theoretical"])
    assert ceilings.ceiling_for(limits, "tensor", "float32") == ceilings.ceiling_for(limits, "fp32_fma", "float32")
    for dtype in ("bfloat16", "float16"):
        want = (c[f"tensor.{dtype}"]["value"], c[f"tensor.{dtype}"]["theoretical"])
        assert ceilings.ceiling_for(limits, "fp32_fma", dtype) == ceilings.ceiling_for(limits, "tensor", dtype) == want
    assert limits["tensor"]["float32"] == limits["fp32_fma"]
    assert ceilings.ceiling_for(limits, "fp32_fma", "float64") == (None, None)
    assert ceilings.ceiling_for({}, "dram_copy", "float32") == (None, None)
    assert "DRAM copy" in ceilings.summary(limits) and "bfloat16 tensor" in ceilings.summary(limits)


def test_no_recorded_bench_row_passes_100_percent_of_its_ceiling(hardware):
    """The issue this layout fixes: on the recorded H100 data, the best probe bounds every step and
    tier the bench timed (the autotuned Triton vector_add beat torch.add, so a Triton add is a probe)."""
    from rosetta.ops import SPECS

    limits = ceilings.from_hardware(hardware)
    for r in results.read_rows(FIXTURES / "bench.csv"):
        ceiling, theoretical = ceilings.ceiling_for(limits, SPECS[r["op"]].ceiling, r["dtype"])
        if r["status"] == "ok":
            assert r["throughput"] <= ceiling < theoretical, f"{r['label']} {r['dtype']} {r['shape']}"


def test_bench_ceilings_read_a_survey_from_before_the_probe_list(tmp_path, hardware):
    legacy = {"facts": hardware["facts"], "measured": {
        "dram_copy_own": {"median": 2983.0}, "dram_copy_torch": {"median": 3000.5}, "dram_read": {"median": 2984.2},
        "fp32_fma": {"tflops": 65.26}, "tensor": {"bf16": {"median": 698.1}}}}
    (tmp_path / "hardware.json").write_text(json.dumps(legacy))
    limits = ceilings.load(tmp_path)
    assert limits["dram_copy"] == 3000.5 and limits["best"]["dram_copy"] == "copy_torch"
    assert ceilings.ceiling_for(limits, "fp32_fma", "bfloat16")[0] == 698.1


def test_bench_ceilings_fall_back_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="theoretical peaks"):
        limits = ceilings.load(tmp_path)
    assert limits["source"] == "theoretical"
    assert ceilings.ceiling_for(limits, "dram_copy", "float32")[0] == limits["theoretical"]["dram_copy"]


def test_hardware_markdown_lists_every_probe_and_ceiling(hardware):
    text = markdown(hardware)
    for name in [*hardware["probes"], *best.CEILINGS]:
        assert f"| {name} |" in text
    assert "2 (DDR) x 2619.0 MHz" in text and "% of theoretical" in text


def _rows_with_a_backward():
    """The recorded bench rows plus a softmax forward and backward headline (the fixture predates
    softmax): a backward point has its own intensity (3 x bytes, 4 flop per element)."""
    rows = results.read_rows(FIXTURES / "bench.csv")
    for direction, p50 in (("forward", 0.0479), ("backward", 0.0690)):
        rows.append({**rows[0], "op": "softmax", "direction": direction, "backend": "triton", "step": 2,
                     "label": "softmax/triton/02_online", "dtype": "float32", "shape": "4096x4096",
                     "role": "headline", "status": "ok", "p50_ms": p50})
    return rows


def test_roofline_points_sit_at_their_true_intensity(tmp_path, hardware):
    rows = _rows_with_a_backward()
    points = roofline.points(rows)
    by = {(p["label"], p["direction"]): p for p in points}
    assert by[("vector_add/cuda/04_unrolled_blocks", "forward")]["intensity"] == pytest.approx(1 / 12)
    assert by[("reduce_sum/cuda/10_deep_loads", "forward")]["intensity"] == pytest.approx(1 / 4)
    assert by[("softmax/triton/02_online", "forward")]["intensity"] == pytest.approx(5 / 8)
    assert by[("softmax/triton/02_online", "backward")]["intensity"] == pytest.approx(4 / 12)
    row = next(r for r in rows if r["label"] == "reduce_sum/cuda/10_deep_loads"
               and r["role"] == "headline" and r["dtype"] == "float32")
    assert by[("reduce_sum/cuda/10_deep_loads", "forward")]["tflops"] == pytest.approx(2**28 / (row["p50_ms"] * 1e-3) / 1e12)

    fig = roofline.figure(hardware, rows)
    truth = {(round(p["intensity"], 12), round(p["tflops"], 9)) for p in points}
    drawn = [(round(float(x), 12), round(float(y), 9)) for ax in fig.axes
             for coll in ax.collections for x, y in coll.get_offsets()]
    assert drawn and set(drawn) <= truth  # no point moved off its intensity (or its rate)
    zoom = fig.axes[1]
    labels = [t for t in zoom.texts if hasattr(t, "xyann")]
    assert any(t.get_text() == "triton/02_online (backward)" for t in labels)
    fig.canvas.draw()  # lays the annotations out at their offsets
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text, not its leader line
    overlaps = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert not overlaps, f"{len(overlaps)} label pairs collide"
    path = roofline.plot(hardware, rows, tmp_path / "roofline.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
