"""Results are data: tidy rows in results/<gpu>/bench.csv plus environment.json beside them.
Tables and plots are made from these files only."""
from __future__ import annotations

import csv
import functools
import json
import re
import subprocess
from pathlib import Path

COLUMNS = [
    "op", "direction", "backend", "step", "name", "label", "dtype", "shape", "numel", "role", "layout", "status",
    "error", "p50_ms", "p20_ms", "p80_ms", "timing", "input_copy", "throughput", "metric",
    "pct_of_ceiling", "pct_of_theoretical", "speedup_vs_torch", "device_nloc", "device_tokens",
    "host_nloc", "git_sha",
]
KEY = ("label", "direction", "dtype", "shape", "layout")
# layout "": the inputs as make_inputs made them (the ladder tables); DEFAULT_LAYOUT: the same, measured
# in turns beside the other input layouts (role "layout"), the base of their ratios
DEFAULT_LAYOUT = "default"
NUMERIC = {"step": int, "numel": int, "device_nloc": int, "device_tokens": int, "host_nloc": int,
           "error": float, "p50_ms": float, "p20_ms": float, "p80_ms": float,
           "throughput": float, "pct_of_ceiling": float, "pct_of_theoretical": float,
           "speedup_vs_torch": float}
DIRECTIONS = ("forward", "backward")


def read_csv(path: Path) -> list[dict]:
    """The rows of a results CSV as text ([] when the file is absent), each with a direction."""
    if not path.exists():
        return []
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["direction"] = row.get("direction") or "forward"  # files from before directions existed
    return rows


def read_rows(path: Path) -> list[dict]:
    rows = read_csv(path)
    for row in rows:
        row["layout"] = row.get("layout") or ""  # "": the inputs as make_inputs made them
        if "rel_error" in row:  # files from before the elementwise gate
            row["error"] = row.pop("rel_error")
        for col, kind in NUMERIC.items():
            value = row.get(col, "")
            row[col] = kind(value) if value not in ("", None) else None
    return rows


def write_rows(path: Path, rows: list[dict], replace_all: bool) -> list[dict]:
    """Write `rows`; unless `replace_all`, keep earlier rows that this run did not measure."""
    if not replace_all:
        fresh = {tuple(str(r[k]) for k in KEY) for r in rows}
        rows = [r for r in read_rows(path) if tuple(str(r[k]) for k in KEY) not in fresh] + rows
    rows = sorted(rows, key=order_key)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row.get(k)) for k in COLUMNS})
    return rows


def order_key(row: dict):
    """Teaching order: op, direction, then torch tiers, library and peer tiers, then each backend's
    steps in order; then dtype, size."""
    from rosetta.registry import BACKENDS, OPS

    from .tier_names import REFERENCE_BACKENDS, TORCH_TIERS

    backend_rank = {b: i for i, b in enumerate((*REFERENCE_BACKENDS, *BACKENDS))}
    tier_rank = {name: i for i, name in enumerate(TORCH_TIERS)}
    return (OPS.index(row["op"]), DIRECTIONS.index(row.get("direction") or "forward"),
            backend_rank[row["backend"]], row["step"] or 0, tier_rank.get(row["name"], 0),
            str(row["dtype"]), row["numel"] or 0)


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def write_environment(path: Path, env: dict) -> None:
    path.write_text(json.dumps(env, indent=2) + "\n")


def read_environment(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def shape_of(text: str) -> tuple[int, ...]:
    """A results row's shape column ("256x262144") as a tuple of ints."""
    return tuple(int(s) for s in text.split("x")) if text else ()


def changed_since_run(folder: Path, variants) -> dict:
    """{step: the run} for the steps whose code (the file past its header comment, without comment
    lines, and the same of every shared CUDA header or Triton module it uses) differs from the
    code at the commit of a bench run that measured its rows (each row's git_sha in bench.csv; the
    folder's environment.json for rows without one): those rows describe the earlier code. Empty
    when git, or the commit, is not at hand (a tarball, a shallow clone)."""
    latest = read_environment(folder / "environment.json").get("git_sha")
    runs: dict = {}
    for r in read_csv(folder / "bench.csv"):
        runs.setdefault(r["label"], set()).add(r.get("git_sha") or latest)
    changed = {}
    for v in variants:
        now = _measured_code(v.source)
        for sha in sorted(runs.get(v.label, {latest}) - {None, ""}):
            if (then := _measured_code(v.source, sha)) is not None and then != now:
                changed[v] = sha
                break
    return changed


_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"', re.MULTILINE)
_TRITON_IMPORT = re.compile(r"^from rosetta\.triton_kernels\.(\w+) import", re.MULTILINE)


def _measured_code(source: str, sha: str | None = None) -> str | None:
    """_code of a step file as committed at sha (None: as it is now), followed by the code of what
    it shares, transitively: the headers a CUDA step includes from cuda-kernels/common, the modules
    a Triton step imports from triton-kernels/. A shared file edited after the run (a tensor map's
    setting in hopper.cuh, attention_common's loads) changes what every step using it runs.
    None when the step file is not at hand at sha; a shared file missing there counts as empty."""
    from rosetta.cuda_build import COMMON_DIR
    from rosetta.registry import REPO
    from rosetta.steps import KERNEL_DIRS

    def read(path: str) -> str | None:
        if sha is not None:
            return _source_at(sha, path)
        return (REPO / path).read_text() if (REPO / path).is_file() else None

    text = read(source)
    if text is None:
        return None
    uses, path_of = ((_INCLUDE, lambda name: COMMON_DIR / name) if source.endswith(".cu")
                     else (_TRITON_IMPORT, lambda name: KERNEL_DIRS["triton"] / f"{name}.py"))
    parts, seen = [_code(text)], set()
    pending = uses.findall(text)
    while pending:
        name = pending.pop()
        if name in seen or not path_of(name).is_file():
            continue  # seen, or not a committed shared file (rosetta_ops.h is generated)
        seen.add(name)
        shared = read(str(path_of(name).relative_to(REPO))) or ""
        parts.append(_code(shared))
        pending += uses.findall(shared)
    return "\n".join(parts)


@functools.lru_cache(maxsize=None)
def _source_at(sha: str, source: str) -> str | None:
    """A file as committed at sha (None: no git, no such commit or file); `make docs` asks for each
    step twice, for README and for KERNEL_LOG."""
    from rosetta.registry import REPO

    then = subprocess.run(["git", "-C", str(REPO), "show", f"{sha}:{source}"], capture_output=True, text=True)
    return then.stdout if then.returncode == 0 else None


def _code(source: str) -> str:
    """A step file without its leading header (a /* */ comment or a docstring) and without the
    lines that hold only a comment (// in CUDA, # in Python): rewording either compiles the same,
    and so does re-indenting or re-spacing the lines of CUDA (Python's indentation is code). A
    shared CUDA header, which opens with // lines instead, loses its comment lines the same way."""
    for opening, closing, comment in (("/*", "*/", "//"), ('"""', '"""', "#"), ("//", "", "//")):
        if source.startswith(opening):
            body = source[source.find(closing, len(opening)) + len(closing):] if closing else source
            lines = [line for line in body.splitlines() if not line.lstrip().startswith(comment)]
            if comment == "//":
                lines = [line.strip() for line in lines if line.strip()]
            return "\n".join(lines)
    return source
