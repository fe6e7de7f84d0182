"""compute-sanitizer output -> one row per (tool, step, direction); the markdown and csv tables.

A sanitizer report is a headline line `========= <what>` followed by indented detail lines
(`=========     at ...`), and ends with `========= ERROR SUMMARY: N errors` (memcheck, synccheck,
initcheck) or `========= RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)`. The
driver's `ROSETTA-STEP <label> <direction> <dtype> <shape>` lines, printed (flushed) before each
step's launches into the same stream, say which step every headline after them belongs to.
Device errors (bad accesses, races, barriers, uninitialized reads) and API errors ("Program hit
cudaErrorX on CUDA API call to ...", often the driver probing itself) are counted apart.
"""
from __future__ import annotations

import csv
import fnmatch
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

SETUP, UNATTRIBUTED, PROCESS = "(setup)", "(unattributed)", "(process)"
HEADLINE = re.compile(r"^========= (\S.*?)\s*$")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+) errors?")
# the racecheck summary may wrap: "... 100 hazards displayed\n========= (4528176 errors, ...)"
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed\s*(?:=========\s*)?"
                          r"(?:\((\d+) errors?,\s*(\d+) warnings?\))?")
# lines under "=========" that are not a finding of their own
NOT_FINDINGS = re.compile(r"^(COMPUTE-SANITIZER|CUDA-MEMCHECK|\S+ SUMMARY:|\(\d+ errors?|Target application"
                          r" returned|Process ID|(at|by|and|in|Address|Access|Saved|Host Frame|Device Frame)\b)")
API = re.compile(r"^(Program hit|CUDA API Error|Host API|Cuda API)", re.I)
WARNING = re.compile(r"^(Warning: Race|WARN)", re.I)
CSV_FIELDS = ("tool", "op", "backend", "step", "direction", "cases", "skipped", "errors", "warnings",
              "api_errors", "status", "first", "first_api")


@dataclass
class Row:
    tool: str
    op: str
    backend: str
    step: str  # the step's label (op/backend/NN_name), or (setup) / (unattributed) / (process)
    direction: str = ""
    cases: int = 0  # dtype x shape cases that reached their marker
    skipped: int = 0  # cases refused by a declared limit (ValueError before launch)
    errors: int = 0  # device-side errors (racecheck: error-level hazards)
    warnings: int = 0  # racecheck warning-level hazards
    api_errors: int = 0
    status: str = "ok"  # ok | errors | exception | not run | crashed ... | timed out ...
    first: str = ""  # the first device error or failure, with the case it happened in
    first_api: str = ""  # the first API error

    def note(self, text: str) -> None:
        self.first = self.first or text


@dataclass
class Run:
    """One sanitizer process, parsed."""
    tool: str
    op: str
    backend: str
    rows: list[Row] = field(default_factory=list)
    summary: str = ""  # the sanitizer's own summary line(s), verbatim
    reported: int | None = None  # the summary's count (racecheck: hazards displayed)
    status: str = "ok"


def _finding(lines: list[str], i: int) -> tuple[str, str]:
    """(headline, location) of the finding at lines[i]: the location is its first `at ...` line."""
    head = HEADLINE.match(lines[i]).group(1)
    for line in lines[i + 1:i + 4]:
        detail = line.removeprefix("=========").strip()
        if detail.startswith("at "):
            return head, detail[3:]
    return head, ""


def compact(message: str) -> str:
    """Kernel signatures without argument lists, paths without folders: what fits in a cell."""
    previous = None
    while previous != message:
        # an argument list follows a name and is empty or longer than "thread(s)"'s "(s)"
        previous, message = message, re.sub(r"(?<=[\w>])\((|[^()]{3,})\)(?=[+\s]|$)", "", message)
    return re.sub(r"(?:/[^\s/]+)+/([^\s/]+:\d+)", r"\1", message)


def parse(text: str, tool: str, op: str, backend: str, *, returncode: int | None = 0,
          timed_out: bool = False, expected: tuple = ()) -> Run:
    """Rows for one process's combined stdout+stderr. `expected`: (label, direction) pairs that
    should appear (the registry's): those without a marker become "not run" rows."""
    run = Run(tool, op, backend)
    rows: dict[tuple[str, str], Row] = {}

    def row(label: str, direction: str = "") -> Row:
        return rows.setdefault((label, direction), Row(tool, op, backend, label, direction))

    def special(name: str) -> Row:  # (setup) etc., named per op/backend so tables keep them apart
        return row(f"{op}/{backend}/{name}")

    for label, direction in expected:
        row(label, direction)
    current, case, done = special(SETUP), "", False
    seen: list[Row] = []  # steps in the order their markers came
    last_printed = -1  # index in `seen` of the step holding the last printed finding
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("ROSETTA-"):
            kind, _, rest = line.partition(" ")
            parts = rest.split()
            if kind in ("ROSETTA-STEP", "ROSETTA-SKIP", "ROSETTA-EXCEPTION") and len(parts) >= 4:
                current, case = row(parts[0], parts[1]), " ".join(parts[2:4])
                if kind == "ROSETTA-STEP":
                    current.cases += 1
                    if current not in seen:
                        seen.append(current)
                elif kind == "ROSETTA-SKIP":
                    current.skipped += 1
                else:
                    current.status = "exception"
                    current.note(f"{' '.join(parts[4:])[:160]} [{case}]")
            elif kind in ("ROSETTA-INPUTS", "ROSETTA-DONE"):
                current, case = special(SETUP), ""
                done = done or kind == "ROSETTA-DONE"
            continue
        match = HEADLINE.match(line)
        if not match or NOT_FINDINGS.match(match.group(1)):
            continue
        last_printed = len(seen) - 1
        head, where = _finding(lines, i)
        text_ = compact(head + (" at " + where if where else ""))[:160] + (f" [{case}]" if case else "")
        if API.match(head):
            current.api_errors += 1
            current.first_api = current.first_api or text_
            continue
        if tool == "racecheck" and WARNING.match(head):
            current.warnings += 1
        else:
            current.errors += 1
        current.note(text_)

    _summary(run, text, tool)
    attributed = sum(r.errors + r.warnings + (0 if tool == "racecheck" else r.api_errors)
                     for r in rows.values())
    if run.reported is not None and run.reported > attributed:
        extra = special(UNATTRIBUTED)
        extra.errors = run.reported - attributed
        extra.note("counted in the summary but not printed (--print-limit) or not parsed")
        for r in seen[last_printed + 1:]:  # ran after the sanitizer stopped printing: unknown
            r.status = "unknown (print limit)"
    for r in rows.values():
        if r.status == "ok" and (r.errors or r.warnings):
            r.status = "errors"
        if not is_special(r.step) and not r.cases and r.status == "ok":
            r.status = "not run"
    run.status = _process_status(run, returncode, timed_out, done)
    if run.status != "ok":
        failure = special(PROCESS)
        failure.status = run.status
        failure.note(_last_words(lines)[:200])
    run.rows = [r for r in rows.values() if not r.step.endswith(SETUP) or _worth_a_row(r)]
    return run


def _summary(run: Run, text: str, tool: str) -> None:
    races = RACE_SUMMARY.findall(text)
    errors = ERROR_SUMMARY.findall(text)
    if tool == "racecheck" and races:
        run.reported = sum(int(displayed) for displayed, _, _ in races)
    elif errors:
        run.reported = sum(int(n) for n in errors)
    run.summary = "; ".join(m.group(0).replace("\n", " ").replace("=========", "").strip()
                            for m in (*RACE_SUMMARY.finditer(text), *ERROR_SUMMARY.finditer(text)))


def is_special(step: str) -> bool:
    return step.endswith(")")


def _process_status(run: Run, returncode, timed_out: bool, done: bool) -> str:
    if timed_out:
        return "timed out"
    if returncode == 3:  # the driver's own exit after a step left the CUDA context unusable
        return "aborted (CUDA context lost)"
    if returncode not in (0, None):
        return f"crashed (exit {returncode})"
    if not done:
        return "stopped before ROSETTA-DONE"
    if run.reported is None:
        return "no sanitizer summary"
    return "ok"


def _last_words(lines: list[str]) -> str:
    """The last line that says something (a traceback's last line, a sanitizer error)."""
    for line in reversed(lines):
        line = line.strip()
        if line and not line.startswith("=========") and not line.startswith("ROSETTA-"):
            return line
    return ""


# ---- tool limits -------------------------------------------------------------------------------
# A probe (bench/sanitize/probes/) is a minimal program that shows one kind of report to be the
# tool's blind spot, not the kernel's bug. Its header says which rows it explains, one line each:
# "Explains: <tool> <step label, shell-style wildcards> [direction]". Those rows keep their counts;
# their cells name the probe, and the total counts them apart.

PROBES = Path(__file__).parent / "probes"
EXPLAINS = re.compile(r"Explains:\s*(\w+)\s+(\S+)(?:\s+(\w+))?")


@dataclass(frozen=True)
class Limit:
    tool: str
    steps: str  # a step label pattern
    direction: str  # "" for every direction
    probe: str  # the probe's file name
    what: str  # the first line of its header: what it asks


def known_limits(folder: Path = PROBES) -> list[Limit]:
    """Every probe's Explains: lines; `what` is the first line of its header comment."""
    limits = []
    for path in sorted(folder.glob("*")):
        text = path.read_text()
        first = next((line.strip("/#\" ").strip() for line in text.splitlines() if line.strip("/#\" ").strip()), "")
        limits += [Limit(m[1], m[2], m[3] or "", path.name, first) for m in EXPLAINS.finditer(text)]
    return limits


def explained_by(row: Row, limits: list[Limit]) -> Limit | None:
    """The probe that explains this row's device errors (or race warnings), if any."""
    if not (row.errors or row.warnings):
        return None
    if is_special(row.step) and not row.step.endswith(UNATTRIBUTED):
        return None  # setup and failed processes are never a step's tool limit
    return next((lim for lim in limits if lim.tool == row.tool and fnmatch.fnmatchcase(row.step, lim.steps)
                 and lim.direction in ("", row.direction)), None)


def _worth_a_row(r: Row) -> bool:
    return bool(r.errors or r.warnings or r.api_errors or r.status != "ok")


# ---- tables ------------------------------------------------------------------------------------

def _cell(r: Row, limits: list[Limit]) -> str:
    if r.status not in ("ok", "errors", "exception"):
        return r.status.split(":")[0]  # not run, crashed, timed out, build failed (the Runs table says why)
    if r.cases and r.skipped >= r.cases:
        return "skipped (limit)"
    text = str(r.errors) + (f" (+{r.warnings} warn)" if r.warnings else "")
    limit = explained_by(r, limits)
    text += f" (tool limit: {limit.probe})" if limit else ""
    return text + (" + exception" if r.status == "exception" else "")


def _order(runs: list[Run]) -> list[tuple[str, str]]:
    """(step, direction) keys: op/backend in first-seen order, steps in order, specials last."""
    prefixes: dict[str, int] = {}
    keys = {(r.step, r.direction) for run in runs for r in run.rows}
    for run in runs:
        prefixes.setdefault(f"{run.op}/{run.backend}/", len(prefixes))

    def key(k):
        step, direction = k
        prefix = next((p for p in prefixes if step.startswith(p)), "")
        return prefixes.get(prefix, len(prefixes)), is_special(step), step, direction != "forward", direction
    return sorted(keys, key=key)


def markdown(runs: list[Run], tools: tuple[str, ...], *, commands: list[str], date: str,
             gpu: str = "", notes: list[str] = ()) -> str:
    """The step x tool matrix (errors per cell; 0 is shown as 0), the findings, the tool limits
    that explain some of them, the runs."""
    limits = known_limits()
    grid: dict[tuple[str, str], dict[str, Row]] = {}
    for run in runs:
        for r in run.rows:
            grid.setdefault((r.step, r.direction), {})[run.tool] = r
    out = [f"# compute-sanitizer{' on ' + gpu if gpu else ''}", "",
           f"Date: {date}. Each cell: device-side errors (racecheck: error-level hazards) over every "
           "dtype x small test shape the step takes; '-': not run on that backend (or not selected). "
           "Rows in parentheses: findings outside any step (setup), past the print limit "
           "(unattributed), or a run that failed (process).", "",
           "| step | direction | " + " | ".join(tools) + " |",
           "|---|---|" + "---|" * len(tools)]
    for step, direction in _order(runs):
        by_tool = grid[(step, direction)]
        cells = [_cell(by_tool[t], limits) if t in by_tool else "-" for t in tools]
        out.append(f"| {step} | {direction} | " + " | ".join(cells) + " |")
    findings = [r for run in runs for r in run.rows if r.first or r.first_api]
    if findings:
        out += ["", "## Findings (first of each row)", "", "| tool | step | direction | errors | api | first |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r.tool} | {r.step} | {r.direction} | {r.errors} | {r.api_errors} | "
                f"{_escape(r.first or r.first_api)} |" for r in findings]
    used = sorted({lim for run in runs for r in run.rows if (lim := explained_by(r, limits))}, key=lambda x: x.probe)
    if used:
        out += ["", "## Tool limits", "", "Rows whose reports a probe shows to be the tool's blind spot (the "
                "probe is a minimal race-free / fully initialized program that draws the same reports; "
                "KERNEL_LOG tells each story):", "", "| probe | what it asks | explains |", "|---|---|---|"]
        out += [f"| [{lim.probe}](../../bench/sanitize/probes/{lim.probe}) | {_escape(lim.what)} | {lim.tool} "
                f"{lim.steps}{' ' + lim.direction if lim.direction else ''} |" for lim in used]
    out += ["", "## Runs", "", "| tool | op | backend | status | sanitizer summary |", "|---|---|---|---|---|"]
    out += [f"| {run.tool} | {run.op} | {run.backend} | {run.status} | {_escape(run.summary)} |" for run in runs]
    out += ["", f"**{total_line(runs)}**", "", *[line for note in notes for line in (note, "")]]
    out += ["Commands:", "", "```"]
    out += commands + ["```", ""]
    return "\n".join(out)


def rerender(md_path: Path, csv_path: Path, tools: tuple[str, ...]) -> bool:
    """sanitize.md again from sanitize.csv, with what only the run knew (date, GPU, notes, commands,
    the logs line) read back from the file itself: a change to this report's tables reaches the
    committed report without a GPU (`make docs`). True if the file changed."""
    if not (md_path.exists() and csv_path.exists()):
        return False
    text = md_path.read_text()
    lines = text.splitlines()
    gpu = lines[0].removeprefix("# compute-sanitizer").removeprefix(" on ").strip()
    date = re.search(r"^Date: (.*?)\. Each cell", text, re.M)
    total = next((i for i, line in enumerate(lines) if line.startswith("**Total")), None)
    fence = [i for i, line in enumerate(lines) if line == "```"]
    if date is None or total is None or len(fence) < 2 or "Commands:" not in lines[total:fence[0]]:
        return False  # not a report this code wrote: leave it
    notes = [line for line in lines[total + 1:fence[0]] if line and line != "Commands:"]
    runs = read_csv(csv_path)
    # the Runs table's sanitizer summaries are not in the csv: keep the file's
    start = lines.index("## Runs") if "## Runs" in lines else total
    said = {tuple(cells[:3]): cells[4] for line in lines[start:total] if line.startswith("| ")
            and len(cells := [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]) == 5}
    for run in runs:
        run.summary = said.get((run.tool, run.op, run.backend), run.summary)
    new = markdown(runs, tuple(t for t in tools if any(r.tool == t for r in runs)), commands=lines[fence[0] + 1:fence[1]],
                   date=date[1], gpu=gpu, notes=notes)
    tail = lines[fence[1] + 1:]
    new = new + "\n".join(tail) + ("\n" if tail else "")
    if new != text:
        md_path.write_text(new)
    return new != text


RESTART_NOTE = "Started again after hanging past the"


def restart_note(restarted: list[str], timeout: float) -> list[str]:
    """The report's line on runs that timed out once and were started again ([] when none)."""
    if not restarted:
        return []
    names = ", ".join(f"{name} (.build/sanitize/{name.replace(' ', '-')}.log.timed-out)" for name in restarted)
    return [f"{RESTART_NOTE} {timeout:.0f} s limit: {names}; the table shows the second run."]


def restarts(text: str) -> int:
    """How many runs a report's restart_note names (0 without one)."""
    note = [line for line in text.splitlines() if line.startswith(RESTART_NOTE)]
    return note[0].count(".timed-out") if note else 0


def total_line(runs: list[Run]) -> str:
    limits = known_limits()
    errors = sum(r.errors for run in runs for r in run.rows)
    warnings = sum(r.warnings for run in runs for r in run.rows)
    explained = sum(r.errors for run in runs for r in run.rows if explained_by(r, limits))
    api = sum(r.api_errors for run in runs for r in run.rows)
    failed = sum(run.status != "ok" for run in runs)
    apart = f" ({explained} of them in rows a probe explains as the tool's limit)" if explained else ""
    return (f"Total: {errors} device errors{apart}, {warnings} race warnings, {api} API errors; "
            f"{failed} of {len(runs)} sanitizer runs failed.")


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_csv(runs: list[Run], path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for run in runs:
            for r in run.rows:
                writer.writerow({k: v for k, v in asdict(r).items() if k in CSV_FIELDS})


NOT_STARTED = "not started (time budget)"


def merge_with_earlier(runs: list[Run], earlier: list[Run]) -> tuple[list[Run], int, int]:
    """This run's `runs` with the earlier table's: (runs to report, earlier runs kept because they
    were not selected, earlier runs kept because this run's did not start in time). A run that never
    started says nothing about the code, so where the table has that (tool, op, backend) its earlier
    result stands; the exit status still tells that the run was incomplete."""
    key = lambda r: (r.tool, r.op, r.backend)  # noqa: E731
    before = {key(r): r for r in earlier}
    merged, carried = [], 0
    for r in runs:
        if r.status == NOT_STARTED and key(r) in before:
            merged.append(before[key(r)])
            carried += 1
        else:
            merged.append(r)
    selected = {key(r) for r in runs}
    kept = [r for r in earlier if key(r) not in selected]
    return merged + kept, len(kept), carried


def read_csv(path) -> list[Run]:
    """An earlier sanitize.csv as runs (one per tool, op, backend; their summary lines are not kept
    in the csv): what a run over some ops, backends or tools merges its own runs into."""
    try:
        with open(path, newline="") as f:
            records = list(csv.DictReader(f))
    except FileNotFoundError:
        return []
    counts = {"cases", "skipped", "errors", "warnings", "api_errors"}
    runs: dict[tuple[str, str, str], Run] = {}
    for rec in records:
        row = Row(**{k: int(v) if k in counts else v for k, v in rec.items() if k in CSV_FIELDS})
        run = runs.setdefault((row.tool, row.op, row.backend),
                              Run(row.tool, row.op, row.backend, summary="(an earlier run: see its date in git)"))
        run.rows.append(row)
        if row.step == PROCESS:  # the process's own failure; a step's errors leave the run "ok"
            run.status = row.status
    return list(runs.values())

