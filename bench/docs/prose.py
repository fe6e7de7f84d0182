"""Measured figures in hand-written prose are placeholders, filled from the committed results.

A lesson or summary never types a measured number. It writes `{{KEY}}`, and `make docs` renders it
as `<!--{{KEY}}-->3,130 GB/s<!--}}-->`: the comments keep the key, so the next regeneration
rewrites the figure from the results of that day. Predictions are exempt: they are written before
the measurement and stay as written. `typed_figures()` finds what slipped through (a test runs it).

KEY, fields separated by spaces:

    LABEL [DIRECTION] DTYPE SHAPE FIELD         a bench.csv row (headline, else sweep)
    ncu LABEL [DIRECTION] DTYPE SHAPE COLUMN    an ncu.csv row; COLUMN as the ncu tables title it
    suite OP BACKEND DTYPE STAT                 the shape suite; DTYPE may be `all`
    case LABEL DTYPE SHAPE FIELD                one case of the shape suite (graph replays):
                                                FIELD us, or x torch (torch's time there / ours)

LABEL is a results label (`softmax/torch/eager`, `softmax/liger/softmax`) or a step written by its
number (`softmax/cuda/05`). DIRECTION defaults to forward. FIELD is one of
    us | GB/s | TFLOP/s            the median time, the throughput
    % | x torch                    share of the measured ceiling; torch's time over this row's
    x LABEL | vs LABEL             this row's throughput over LABEL's on the same case (`1.18x`),
                                   or the same as a change (`+18.2%`)
STAT is one of geomean (graph-replay ratio vs torch), held (share of cases at or above 0.9x),
worst (the worst case and its ratio), cases, eager (geomean of the eager calls' ratio).
"""
from __future__ import annotations

import re
from functools import lru_cache

from .. import results

PLACEHOLDER = re.compile(r"<!--\{\{(?P<rkey>[^{}]+)\}\}-->.*?<!--\}\}-->|\{\{(?P<key>[^{}]+)\}\}", re.S)
DIRECTIONS = results.DIRECTIONS


class Unresolved(KeyError):
    """A placeholder whose key names no committed result."""


def render(text: str, data: "Data") -> str:
    """Fill every placeholder of `text` (bare or already rendered); rendering twice changes nothing."""
    def fill(m):
        key = (m["rkey"] or m["key"]).strip()
        return f"<!--{{{{{key}}}}}-->{data.value(key)}<!--}}}}-->"
    return PLACEHOLDER.sub(fill, text)


def keys(text: str) -> list[str]:
    return [(m["rkey"] or m["key"]).strip() for m in PLACEHOLDER.finditer(text)]


class Data:
    """The committed results of one GPU folder, looked up by placeholder key."""

    def __init__(self, bench_rows: list[dict], ncu_rows: list[dict], suite_records: dict,
                 suite_rows: list[dict] = ()):
        self.rows = bench_rows
        self.ncu = ncu_rows
        self.suite = suite_records  # (op, backend) -> suite_report.per_case records
        self.suite_rows = list(suite_rows)

    @classmethod
    def load(cls, folder) -> "Data":
        from ..profiling import ncu
        from . import suite_report

        suite_rows = results.read_rows(folder / "suite.csv")
        records = {}
        for op, backend in {(r["op"], r["backend"]) for r in suite_rows if r["backend"] in ("cuda", "triton")}:
            records[op, backend] = suite_report.per_case(suite_rows, op, backend)
        return cls(results.read_rows(folder / "bench.csv"), ncu.read_table(folder / "ncu.csv"), records, suite_rows)

    def value(self, key: str) -> str:
        words = key.split()
        try:
            if words[0] == "ncu":
                return self._ncu(words[1:])
            if words[0] == "suite":
                return self._suite(words[1:])
            if words[0] == "case":
                return self._suite_case(words[1:])
            return self._bench(words)
        except (IndexError, ValueError, TypeError) as exc:  # TypeError: a row without that figure
            raise Unresolved(f"{{{{{key}}}}}: {exc}") from None

    # -- bench.csv
    def _row_key(self, words):
        label, rest = words[0], words[1:]
        direction = rest.pop(0) if rest and rest[0] in DIRECTIONS else "forward"
        if len(rest) < 3:
            raise ValueError("expected LABEL [DIRECTION] DTYPE SHAPE FIELD")
        return label, direction, rest[0], rest[1], rest[2:]

    def row(self, label: str, direction: str, dtype: str, shape: str) -> dict:
        found = [r for r in self.rows if _label_matches(r["label"], label) and r["direction"] == direction
                 and r["dtype"] == dtype and r["shape"] == shape and r["layout"] == ""]
        found.sort(key=lambda r: r["role"] != "headline")
        if not found:
            raise ValueError(f"no bench.csv row for {label} {direction} {dtype} {shape}")
        if found[0]["status"] != "ok":
            raise ValueError(f"{found[0]['label']} {direction} {dtype} {shape} is {found[0]['status'][:60]}")
        return found[0]

    def _bench(self, words) -> str:
        label, direction, dtype, shape, field = self._row_key(words)
        r = self.row(label, direction, dtype, shape)
        name = field[0]
        if name == "us" and len(field) == 1:
            return f"{r['p50_ms'] * 1e3:,.1f} us"
        if name in ("GB/s", "TFLOP/s") and len(field) == 1:
            if r["metric"] != name:
                raise ValueError(f"{r['label']} is measured in {r['metric']}, not {name}")
            return f"{r['throughput']:,.0f} GB/s" if name == "GB/s" else f"{r['throughput']:,.1f} TFLOP/s"
        if name == "%" and len(field) == 1:
            return f"{r['pct_of_ceiling']:.1f}%"
        if name == "x" and field[1:] == ["torch"]:
            return f"{r['speedup_vs_torch']:.2f}x"
        if name in ("x", "vs") and len(field) == 2:
            other = self.row(field[1], direction, dtype, shape)
            ratio = r["throughput"] / other["throughput"]
            return f"{ratio:.2f}x" if name == "x" else f"{ratio - 1:+.1%}"
        raise ValueError(f"unknown field {' '.join(field)!r}")

    # -- ncu.csv
    def _ncu(self, words) -> str:
        from ..profiling import ncu

        label, direction, dtype, shape, field = self._row_key(words)
        column = " ".join(field)
        short = {title: (metric, fmt) for title, metric, fmt in ncu.SHORT}
        if column not in short:
            raise ValueError(f"unknown ncu column {column!r} (one of: {', '.join(short)})")
        found = [r for r in self.ncu if _label_matches(r["label"], label) and r["direction"] == direction
                 and r["dtype"] == dtype and r["shape"] == shape]
        if not found:
            raise ValueError(f"no ncu.csv row for {label} {direction} {dtype} {shape}")
        metric, fmt = short[column]
        value = found[0].get(metric)
        if value is None:
            raise ValueError(f"ncu.csv has no {metric} for {found[0]['label']}")
        unit = {"time (us)": " us", "DRAM MB": " MB", "L2<->SM MB": " MB", "smem B": " B"}.get(column, "")
        return fmt(value) + ("%" if column.endswith("%") else unit)

    # -- suite.csv, one case
    def _suite_row(self, label: str, dtype: str, shape: str, run: str | None = None) -> dict:
        found = [r for r in self.suite_rows if r["role"] == "suite" and _label_matches(r["label"], label)
                 and r["dtype"] == dtype and r["shape"] == shape and r["status"] == "ok"
                 and run in (None, r["git_sha"])]
        if not found:
            raise ValueError(f"no timed suite case for {label} {dtype} {shape}" + (f" in run {run}" if run else ""))
        return found[0]

    def _suite_case(self, words) -> str:
        label, dtype, shape, *field = words
        row = self._suite_row(label, dtype, shape)
        if field == ["us"]:
            return f"{row['p50_ms'] * 1e3:,.1f} us"
        if field == ["x", "torch"]:  # torch's time from the run that timed the step
            torch_row = self._suite_row(label.split('/')[0] + '/torch/eager', dtype, shape, row["git_sha"])
            return f"{torch_row['p50_ms'] / row['p50_ms']:.2f}x"
        raise ValueError(f"unknown case field {' '.join(field)!r}")

    # -- suite.csv
    def _suite(self, words) -> str:
        from . import suite_report

        op, backend, dtype, stat = words
        records = [r for r in self.suite.get((op, backend), []) if dtype == "all" or r["dtype"] == dtype]
        if not records:
            raise ValueError(f"no suite cases for {op} {backend} {dtype}")
        s = suite_report.stats(records)
        if stat == "geomean":
            return f"{s['graph_geomean']:.2f}x"
        if stat == "eager":
            return f"{s['eager_geomean']:.2f}x"
        if stat == "eager-slow":  # over the cases where torch's own call takes >= 20 us
            return f"{s['eager_slow_geomean']:.2f}x"
        if stat == "worst-eager":
            w = s["worst_eager"]
            if w is None:
                raise ValueError(f"no case of {op} {backend} {dtype} where torch's call takes >= 20 us")
            return f"{w['eager']:.2f}x ({w['dtype']} {w['shape']})"
        if stat == "held":
            return f"{s['graph_held']:.0%}"
        if stat == "cases":
            return str(s["cases"])
        if stat == "worst":
            w = s["worst"]
            return f"{w['graph']:.2f}x ({w['dtype']} {w['shape']})"
        raise ValueError(f"unknown suite statistic {stat!r}")


@lru_cache(maxsize=None)
def _step_prefix(label: str) -> re.Pattern:
    """`softmax/cuda/05` matches `softmax/cuda/05_row_on_chip`; a full label matches itself."""
    return re.compile(re.escape(label) + (r"_\w+$" if re.fullmatch(r"[\w]+/\w+/\d+", label) else "$"))


def _label_matches(full: str, label: str) -> bool:
    return bool(_step_prefix(label).match(full))


# -- typed figures: a measured number written by hand
UNIT = r"(?:\s?(?:us|µs|ms|ns|GB/s|TB/s|GFLOP/s|TFLOP/s)\b|x\b|×|%\s+of\b)"
FIGURE = re.compile(r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?" + UNIT)
EXEMPT = [
    re.compile(r"<!-- rosetta:begin (\S+) -->.*?<!-- rosetta:end \1 -->", re.S),  # generated blocks
    PLACEHOLDER,
    re.compile(r"^```.*?^```", re.S | re.M),  # code blocks
    re.compile(r"`[^`\n]+`"),  # code spans: identifiers and commands, not claims
    # a prediction is written before the measurement: its paragraph stays as written
    re.compile(r"^\*\*Prediction[.:]?\*\*.*?(?=\n\s*\n|\Z)", re.S | re.M),
]


def typed_figures(text: str) -> list[tuple[int, str]]:
    """(line number, figure) for every measured-looking number written by hand."""
    masked = text
    for pattern in EXEMPT:
        masked = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), masked)
    return [(masked.count("\n", 0, m.start()) + 1, m.group(0)) for m in FIGURE.finditer(masked)]


LESSON = re.compile(r"^\*\*Lesson[.:]?\*\*(.*?)(?=\n\s*\n|\Z)", re.S | re.M)
LESSON_WORDS = 150


def lesson_lengths(text: str) -> list[tuple[int, int]]:
    """(line number, words) of every **Lesson.** paragraph; a rendered figure counts as one word."""
    out = []
    for m in LESSON.finditer(text):
        body = PLACEHOLDER.sub(" FIGURE ", m.group(1))
        out.append((text.count("\n", 0, m.start()) + 1, len(body.split())))
    return out
