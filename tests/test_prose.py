"""Measured figures in prose come from the committed results (bench/docs/prose.py): every
placeholder resolves and is rendered as committed, no measured-looking number is typed by hand
outside a prediction, and each lesson stays short."""
import pytest

from rosetta.bench.docs import prose
from rosetta.bench.docs.report import reference_results
from rosetta.registry import REPO

DOCS = ["README.md", "KERNEL_LOG.md", "bench/METHOD.md"]

ROWS = [
    {"label": "softmax/cuda/05_row_on_chip", "direction": "forward", "dtype": "float32", "shape": "64x64",
     "layout": "", "role": "headline", "status": "ok", "p50_ms": 0.0123, "throughput": 1234.5, "metric": "GB/s",
     "pct_of_ceiling": 40.0, "speedup_vs_torch": 1.5},
    {"label": "softmax/cuda/04_online", "direction": "forward", "dtype": "float32", "shape": "64x64",
     "layout": "", "role": "headline", "status": "ok", "p50_ms": 0.0246, "throughput": 617.25, "metric": "GB/s",
     "pct_of_ceiling": 20.0, "speedup_vs_torch": 0.75},
]


@pytest.fixture(scope="module")
def committed():
    folder = reference_results()
    if folder is None:
        pytest.skip("no committed results")
    return prose.Data.load(folder)


@pytest.mark.parametrize("doc", DOCS)
def test_every_figure_resolves_and_is_rendered_as_committed(doc, committed):
    text = (REPO / doc).read_text()
    assert prose.render(text, committed) == text, f"{doc} is stale: run `make docs`"


@pytest.mark.parametrize("doc", DOCS)
def test_no_measured_figure_is_typed_by_hand(doc):
    typed = prose.typed_figures((REPO / doc).read_text())
    assert not typed, (f"{doc}: measured figures typed by hand (write a {{{{placeholder}}}}, see "
                       f"bench/docs/prose.py): " + ", ".join(f"line {n}: {f!r}" for n, f in typed[:20]))


def test_lessons_stay_short():
    long = [(n, w) for n, w in prose.lesson_lengths((REPO / "KERNEL_LOG.md").read_text())
            if w > prose.LESSON_WORDS * 1.1]
    assert not long, f"KERNEL_LOG lessons over ~{prose.LESSON_WORDS} words (line, words): {long}"


def test_render_fills_each_field_and_is_idempotent():
    data = prose.Data(ROWS, [], {})
    text = ("{{softmax/cuda/05 float32 64x64 GB/s}}, {{softmax/cuda/05 float32 64x64 us}}, "
            "{{softmax/cuda/05 float32 64x64 x torch}}, {{softmax/cuda/05 float32 64x64 %}}, "
            "{{softmax/cuda/05 float32 64x64 x softmax/cuda/04}}, {{softmax/cuda/05 float32 64x64 vs softmax/cuda/04}}")
    out = prose.render(text, data)
    assert [v.split("-->")[1] for v in out.split("<!--}}-->")[:-1]] == \
        ["1,234 GB/s", "12.3 us", "1.50x", "40.0%", "2.00x", "+100.0%"]
    assert prose.render(out, data) == out
    assert prose.keys(out) == prose.keys(text)
    assert not prose.typed_figures(out)


@pytest.mark.parametrize("key", ["softmax/cuda/05 float32 128x128 GB/s", "softmax/cuda/05 float32 64x64 TFLOP/s",
                                 "softmax/cuda/09 float32 64x64 us", "softmax/cuda/05 float32 64x64 furlongs",
                                 "ncu softmax/cuda/05 float32 64x64 DRAM %", "suite softmax cuda all geomean"])
def test_a_key_that_names_no_result_fails_loudly(key):
    with pytest.raises(prose.Unresolved, match="softmax"):
        prose.render("{{" + key + "}}", prose.Data(ROWS, [], {}))


def test_typed_figures_skip_predictions_code_and_generated_blocks():
    text = ("**Prediction.** ~2,700 GB/s and 1.2x torch.\n\n**Lesson.** 3,053 GB/s, 0.91x torch, 83.0% of peak; "
            "`BLOCK=4x` and 4 x 16 KB.\n\n<!-- rosetta:begin a -->\n| 12.5 us |\n<!-- rosetta:end a -->\n")
    assert [f for _, f in prose.typed_figures(text)] == ["3,053 GB/s", "0.91x", "83.0% of"]


def test_suite_statistics_render_from_the_records():
    """{{suite OP BACKEND DTYPE STAT}}: the kernel geomean, the eager geomean over every case and over
    those where torch's own call takes >= 20 us, and the worst eager case among those."""
    def case(shape, graph, eager, torch_call_ms):
        return {"dtype": "float32", "shape": shape, "graph": graph, "eager": eager, "torch_call_ms": torch_call_ms,
                "dispatch": 1.0, "step": 5, "fastest": 5}

    records = [case("8x1000", 2.0, 0.5, 0.010), case("4096x4096", 1.0, 2.0, 0.050), case("4096x50257", 1.0, 0.5, 0.400)]
    data = prose.Data(ROWS, [], {("softmax", "triton"): records})
    values = [prose.render("{{suite softmax triton all " + stat + "}}", data).split("-->")[1].split("<!--")[0]
              for stat in ("geomean", "eager", "eager-slow", "worst-eager")]
    assert values == ["1.26x", "0.79x", "1.00x", "0.50x (float32 4096x50257)"]
