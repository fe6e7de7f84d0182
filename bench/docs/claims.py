"""Claims common in Triton teaching material, checked against our committed results (no GPU).

A claim is made of parts. A part is a list of evidence -- one number per case (op, direction,
dtype, shape), computed from bench.csv rows or from the step sources' line counts, with the rows it
comes from -- and a band: the values the claim asserts. A part holds when every case falls in its
band, does not hold when none does, and depends otherwise; a "depends" names the case attribute
(op, direction, dtype or shape) that splits the cases in two, when one does. A "~" in a claim widens
its band by SLACK at each end. A part without a band is context: shown, never judged. A part with
no measured case is "not measured in the committed run", and so is its claim."""
from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass

import rosetta
from rosetta.ops import SPECS

from ..run.tiers import tiers
from . import site_data, tables
from .site_step import throughput

SLACK = 0.05
HOLDS, FAILS, DEPENDS, UNMEASURED = "holds", "does not hold", "depends", "not measured in the committed run"
PLACES = ("within", "below", "above")  # where a value falls against a band, in the order they are told
KEYS = ("op", "direction", "dtype", "shape")  # coarse to fine: the order a "depends" is explained in
GROUPED = re.compile(r"\bgroup(?:s|ed)?\b", re.I)  # a Changed line that introduces a grouped tile order


@dataclass(frozen=True)
class Band:
    """The values a claim asserts: lo <= value <= hi; None is unbounded."""
    lo: float | None = None
    hi: float | None = None

    def place(self, value: float) -> str:
        if self.lo is not None and value < self.lo:
            return "below"
        if self.hi is not None and value > self.hi:
            return "above"
        return "within"

    def text(self, unit: str) -> str:
        if self.hi is None:
            return f">= {number(self.lo, unit)}"
        if self.lo is None:
            return f"<= {number(self.hi, unit)}"
        return f"{number(self.lo, unit)} to {number(self.hi, unit)}"


def about(lo: float, hi: float) -> Band:
    """A "~" in the claim: its band widened by SLACK at each end."""
    return Band(lo * (1 - SLACK), hi * (1 + SLACK))


def number(value: float, unit: str) -> str:
    return f"{value:.1f}%" if unit == "%" else f"{value:#.3g}{unit}"


@dataclass(frozen=True)
class Source:
    """A row a number is computed from, as the page shows it."""
    label: str
    direction: str
    dtype: str
    shape: str
    value: str


def row_source(row: dict, column: str = "throughput") -> Source:
    value = throughput(row) if column == "throughput" else f"{row[column]:.1f} ({column})"
    return Source(row["label"], row["direction"], row["dtype"], row["shape"], value)


@dataclass(frozen=True)
class Evidence:
    case: tuple[tuple[str, str], ...]  # (key, value) pairs, keys from KEYS
    value: float
    sources: tuple[Source, ...]

    def get(self, key: str) -> str | None:
        return dict(self.case).get(key)

    @property
    def name(self) -> str:
        return " ".join(v for _, v in self.case)


@dataclass(frozen=True)
class Verdict:
    word: str  # HOLDS, FAILS, DEPENDS or UNMEASURED
    on: tuple[str, ...] = ()  # what a "depends" depends on
    detail: str = ""  # which cases fall where; for UNMEASURED, what the claim waits for

    def __str__(self) -> str:
        if self.word == DEPENDS:
            return f"{DEPENDS} (on {' and '.join(self.on)})"
        return f"{self.word} ({self.detail})" if self.word == UNMEASURED and self.detail else self.word


@dataclass(frozen=True)
class Part:
    name: str  # what is compared, e.g. "best Triton step / best CUDA step"
    unit: str  # "x" (a ratio) or "%"
    band: Band | None  # None: context, shown and not judged
    evidence: tuple[Evidence, ...]

    @property
    def verdict(self) -> Verdict:
        return judge(self.evidence, self.band)

    def summary(self) -> str:
        """Our number: the value, or its range and median over the cases."""
        values = sorted(e.value for e in self.evidence)
        if not values:
            return "not measured"
        if len(values) == 1:
            return number(values[0], self.unit)
        return (f"{number(values[0], self.unit)} to {number(values[-1], self.unit)} "
                f"(median {number(statistics.median(values), self.unit)}, {len(values)} cases)")


@dataclass(frozen=True)
class Claim:
    number: int
    text: str
    how: str  # how the numbers are computed and the band read, for the page
    parts: tuple[Part, ...]
    axis: str = ""  # what splits the judged parts when their verdicts differ
    missing: str = ""  # the tier whose rows the claim waits for, named while it has none
    notes: tuple[str, ...] = ()

    @property
    def judged(self) -> list[Part]:
        return [p for p in self.parts if p.band]

    @property
    def verdict(self) -> Verdict:
        verdicts = [p.verdict for p in self.judged]
        if not verdicts or any(v.word == UNMEASURED for v in verdicts):
            return Verdict(UNMEASURED, detail=f"tier {self.missing} added to the bench" if self.missing else "")
        if len(verdicts) == 1:
            return verdicts[0]
        words = {v.word for v in verdicts}
        detail = "; ".join(f"{p.name}: {p.verdict}" for p in self.judged)
        if len(words) == 1 and DEPENDS not in words:
            return Verdict(verdicts[0].word, detail=detail)
        on = ([self.axis] if len(words) > 1 else []) + [o for v in verdicts for o in v.on]
        return Verdict(DEPENDS, tuple(dict.fromkeys(on)), detail)

    def our_number(self) -> str:
        return "; ".join(f"{p.name}: {p.summary()}" for p in self.parts if p.evidence) or "not measured"


# ---- verdicts ----------------------------------------------------------------------------------

def judge(evidence: tuple[Evidence, ...], band: Band | None) -> Verdict:
    if band is None:
        return Verdict("context")
    if not evidence:
        return Verdict(UNMEASURED)
    places = {band.place(e.value) for e in evidence}
    inside = sum(band.place(e.value) == "within" for e in evidence)
    if places == {"within"}:
        return Verdict(HOLDS, detail=f"all {len(evidence)} cases in the band")
    if len(places) == 1:
        return Verdict(FAILS, detail=f"all {len(evidence)} cases {places.pop()} the band")
    if not inside:
        return Verdict(FAILS, detail=f"no case in the band; {tally(evidence, band)}")
    key = splitting_key(evidence, band)
    if key is None:
        return Verdict(DEPENDS, ("the case",),
                       f"{inside} of {len(evidence)} cases in the band; {tally(evidence, band)}")
    sides = {place: [] for place in PLACES}
    for e in evidence:
        sides[band.place(e.value)].append(e.get(key))
    detail = "; ".join(f"{place} the band: {key} {', '.join(dict.fromkeys(values))}"
                       for place, values in sides.items() if values)
    return Verdict(DEPENDS, (f"the {key}",), detail)


def tally(evidence, band: Band) -> str:
    """The cases' places counted per value of the coarsest attribute that varies among them:
    "by op: vector_add 3 above; softmax 7 above, 2 within, 5 below"."""
    key = next((k for k in KEYS if len({e.get(k) for e in evidence}) > 1), None)
    groups = {}
    for e in evidence:
        groups.setdefault(e.get(key) if key else "all", Counter())[band.place(e.value)] += 1
    counts = "; ".join(f"{value} " + ", ".join(f"{c[place]} {place}" for place in PLACES if c[place])
                       for value, c in groups.items())
    return f"by {key}: {counts}" if key else counts


def splitting_key(evidence, band: Band) -> str | None:
    """The first case attribute each of whose values is wholly in or wholly out of the band."""
    for key in KEYS:
        sides = {}
        for e in evidence:
            sides.setdefault(e.get(key), set()).add(band.place(e.value) == "within")
        if len(sides) > 1 and None not in sides and all(len(s) == 1 for s in sides.values()):
            return key
    return None


# ---- picking rows --------------------------------------------------------------------------------

def best_of(backend: str | None):
    """(rows, op, case) -> the highest-throughput step of `backend` (None: of both) at the case."""
    return lambda rows, op, case: site_data.best_at(rows, case, rosetta.variants(op, backend))[1]


def labelled(name: str):
    """(rows, op, case) -> the row of `<op>/<name>` (a tier, or a step's label) at the case."""
    return lambda rows, op, case: site_data.at(rows, case, f"{op}/{name}")


def headline_cases(op: str) -> list[tuple[str, str, str]]:
    """(direction, shape, dtype) of every headline of op, in the tables' order."""
    return [(direction, shape, dtype) for direction, shape, dtype, _ in tables.headlines(op)]


def case_of(op: str, case: tuple) -> tuple:
    direction, shape, dtype = case
    return (("op", op), ("direction", direction), ("dtype", dtype), ("shape", shape))


def ratios(rows, op, top, bottom, keep=lambda case: True) -> tuple[Evidence, ...]:
    """top's throughput over bottom's at every headline of op (that `keep` keeps) where both ran."""
    found = []
    for case in filter(keep, headline_cases(op)):
        a, b = top(rows, op, case), bottom(rows, op, case)
        if a and b:
            found.append(Evidence(case_of(op, case), a["throughput"] / b["throughput"],
                                  (row_source(a), row_source(b))))
    return tuple(found)


def short(label: str) -> str:
    """How the tables name a tier or step: its label without the op ("torch/eager")."""
    return label.split("/", 1)[1]


def untimed(rows, label: str) -> tuple[str, ...]:
    """One note per headline row of `label` that ran but was not timed (wrong, refused, slow)."""
    return tuple(f"not timed: {r['label']} {r['direction']} {r['dtype']} {r['shape']}: {r['status']}"
                 + (f" (error {r['error']:.3g})" if r["status"] == "wrong" and r["error"] is not None else "")
                 for r in rows if r["label"] == label and r["role"] == "headline" and r["status"] != "ok")


def forward(case) -> bool:
    return case[0] == "forward"


# ---- the claims ----------------------------------------------------------------------------------

def triton_vs_cuda(rows) -> Claim:
    # The op's metric says what bounds it: GB/s ops are memory-bound, TFLOP/s ops compute-bound.
    # "Matches": within SLACK of CUDA, or faster.
    kinds = {"GB/s": ("memory-bound", Band(1 - SLACK, None)), "TFLOP/s": ("compute-bound", about(0.80, 0.90))}
    parts = []
    for metric, (kind, band) in kinds.items():
        ops = [op for op in rosetta.ops_with_steps() if SPECS[op].metric == metric]
        evidence = sum((ratios(rows, op, best_of("triton"), best_of("cuda")) for op in ops), ())
        parts.append(Part(f"{kind} ({', '.join(ops)}): best Triton / best CUDA", "x", band, evidence))
    return Claim(1, "Triton matches CUDA on memory-bound kernels and reaches ~80-90% of CUDA on compute-bound ones.",
                 "At every headline (op, direction, dtype, shape): the fastest Triton step over the fastest CUDA "
                 f"step. Memory-bound ops (GB/s) match when Triton is within {SLACK:.0%} of CUDA or faster; "
                 "compute-bound ops (TFLOP/s) are judged against ~80-90%.", tuple(parts),
                 axis="memory- vs compute-bound")


def fused_softmax(rows) -> Claim:
    parts = tuple(Part(f"best Triton / {tier}{note}", "x", band,
                       ratios(rows, "softmax", best_of("triton"), labelled(tier), forward))
                  for tier, note, band in (("torch/unfused", "", about(3, 4)),
                                           ("torch/eager", " (torch.softmax)", None), ("torch/compile", "", None)))
    return Claim(2, "A fused softmax is ~3-4x faster than the unfused PyTorch decomposition.",
                 "At every forward softmax headline: the fastest Triton step (each is one fused kernel) over "
                 "torch/unfused (max, subtract, exp, sum and divide as separate torch ops); torch.softmax and "
                 "torch.compile are shown beside it, not judged. An unfused row that failed the gate is listed "
                 "as not timed.",
                 parts, missing="torch/unfused", notes=untimed(rows, "softmax/torch/unfused"))


def compile_vs_hand_tuned(rows) -> Claim:
    evidence = sum((ratios(rows, op, labelled("torch/compile"), best_of(None)) for op in rosetta.ops_with_steps()), ())
    return Claim(3, "torch.compile reaches ~70% of hand-tuned kernels.",
                 "At every headline of every op: torch/compile over the fastest of our steps (CUDA or Triton).",
                 (Part("torch/compile / best step", "x", about(0.70, 0.70), evidence),))


def grouped_order(rows) -> Claim:
    """The first step of each matmul ladder whose Changed line introduces a grouped order, over the
    step before it. Triton's changes only the program-to-tile map, so it is the evidence; CUDA's
    comes with other changes in the same step, so it is context."""
    parts, notes = [], []
    for backend, band in (("triton", about(1.11, 1.11)), ("cuda", None)):
        ladder = rosetta.variants("matmul", backend)
        step = next((v for v in ladder if GROUPED.search(v.header.changed)), None)
        if step is None or step.step == 1:
            continue
        before = ladder[step.step - 2]
        parts.append(Part(f"{short(step.label)} / {short(before.label)}", "x", band,
                          ratios(rows, "matmul", labelled(short(step.label)), labelled(short(before.label)))))
        if band is None:
            notes.append(f"{step.label} is the first CUDA step whose Changed line names a grouped order, "
                         f"and it changes more than the order ({step.header.title}): its ratio is context.")
    return Claim(4, "Grouped program ordering raises matmul throughput ~11% (220 -> 245 TFLOP/s on an A100).",
                 "At every matmul headline: the grouped Triton step over the step before it (same tile, warps "
                 "and stages; only the program-to-tile map changes).", tuple(parts), notes=tuple(notes))


def tiny_block(rows) -> Claim:
    block = next(t for t in tiers("vector_add") if t.ablation)
    a = block.ablation
    return Claim(5, f"A tiny BLOCK_SIZE can be ~95x slower than an autotuned one (vector_add at BLOCK={a.value}).",
                 f"At every vector_add headline: the fastest Triton step (autotuned) over {short(block.label)} "
                 f"({a.variant.label} launched with {a.keyword}={a.value}, all else as the step has it).",
                 (Part(f"best Triton / {short(block.label)}", "x", about(95, 95),
                       ratios(rows, "vector_add", best_of("triton"), labelled(short(block.label)))),),
                 missing=short(block.label), notes=untimed(rows, block.label))


def square_bf16(case) -> bool:
    return case[2] == "bfloat16" and len(set(case[1].split("x"))) == 1


def peak_share(rows, pick, keep) -> tuple[Evidence, ...]:
    """% of the dtype's theoretical peak of the row `pick` chooses, at the matmul headlines kept."""
    found = []
    for case in filter(keep, headline_cases("matmul")):
        row = pick(rows, "matmul", case)
        if row and row["pct_of_theoretical"] is not None:
            found.append(Evidence(case_of("matmul", case), row["pct_of_theoretical"],
                                  (row_source(row, "pct_of_theoretical"),)))
    return tuple(found)


def matmul_vs_cublas(rows) -> Claim:
    return Claim(6, "Hand-written Triton matmul lands within 5-15% of cuBLAS, at 70-90% of peak for square bf16.",
                 "At every matmul headline: the fastest Triton step over torch/eager (cuBLAS), judged against "
                 "85-95%; at the square bf16 headlines: the fastest Triton step's % of the theoretical peak "
                 "(pct_of_theoretical), judged against 70-90%, with cuBLAS's beside it.",
                 (Part("best Triton / torch/eager (cuBLAS)", "x", Band(0.85, 0.95),
                       ratios(rows, "matmul", best_of("triton"), labelled("torch/eager"))),
                  Part("best Triton, % of peak, square bf16", "%", Band(70, 90),
                       peak_share(rows, best_of("triton"), square_bf16)),
                  Part("torch/eager (cuBLAS), % of peak, square bf16", "%", None,
                       peak_share(rows, labelled("torch/eager"), square_bf16))),
                 axis="which half of the claim")


def line_counts(rows) -> Claim:
    """Device NLOC of each Triton step over the CUDA step it sits beside (site_data.align: the step
    its Mirrors line reaches), counted from the sources as the site does."""
    evidence, notes = [], []
    for op in rosetta.ops_with_steps():
        for cuda, triton in site_data.align(op):
            if not (cuda and triton and cuda.step in site_data.mirrored(triton)):
                continue
            c, t = site_data.nloc(cuda).device_nloc, site_data.nloc(triton).device_nloc
            # 0: its kernel lives elsewhere (a shared header, or an earlier step it imports), and no
            # step is credited with those lines
            if c == 0 or t == 0:
                notes.append(f"{(cuda if c == 0 else triton).label}: 0 device NLOC in its own file, pair skipped")
                continue
            pair = (("op", op), ("pair", f"{short(triton.label)} vs {short(cuda.label)}"))
            evidence.append(Evidence(pair, t / c, tuple(Source(v.label, "", "", "", f"{n} device NLOC")
                                                        for v, n in ((triton, t), (cuda, c)))))
    return Claim(7, "Triton line counts are a fraction of CUDA's for the same kernel (~15 vs ~45 lines for softmax).",
                 "For every Triton step beside the CUDA step its Mirrors line reaches: its device NLOC (kernel "
                 "bodies, lizard) over that CUDA step's. We read \"a fraction\" as at most half.",
                 (Part("Triton / CUDA device NLOC", "x", Band(None, 0.5), tuple(evidence)),), notes=tuple(notes))


CLAIMS = (triton_vs_cuda, fused_softmax, compile_vs_hand_tuned, grouped_order, tiny_block, matmul_vs_cublas,
          line_counts)


def claims(rows: list[dict]) -> list[Claim]:
    return [make(rows) for make in CLAIMS]


def markdown_summary(rows: list[dict]) -> str:
    """claim | our number | verdict, one line per claim (for the README, via the report generator)."""
    out = ["| claim | our number | verdict |", "|---|---|---|"]
    for c in claims(rows):
        out.append(f"| {c.number}. {c.text} | {c.our_number()} | {c.verdict} |")
    return "\n".join(out) + "\n"
