"""The one registry: every step file under cuda-kernels/ and triton-kernels/ becomes a Variant.

Nothing here is a hand-kept list. A step is the file `<backend-dir>/<op>/<NN>_<name>.<cu|py>`;
its header (Step/Changed/Why/Still/Limits) is parsed from the file's leading comment or docstring.
Tests, bench, line counts, ncu runs and KERNEL_LOG tables all iterate `variants()`.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BACKENDS = ("cuda", "triton")
KERNEL_DIRS = {"cuda": REPO / "cuda-kernels", "triton": REPO / "triton-kernels"}
SUFFIXES = {"cuda": ".cu", "triton": ".py"}
OPS = ("vector_add", "reduce_sum", "softmax", "matmul")

STEP_FILE = re.compile(r"^(?P<num>\d\d)_(?P<name>[a-z0-9_]+)$")
STEP_TITLE = re.compile(r"^Step\s+(?P<num>\d+)\s*[—-]+\s*(?P<title>.+)$")
HEADER_FIELDS = ("Changed", "Why", "Still", "Limits")


class RegistryError(RuntimeError):
    """A step file breaks the layout contract (name, header, numbering)."""


@dataclass(frozen=True)
class Header:
    title: str
    changed: str
    why: str
    still: str
    limits: str


@dataclass(frozen=True, eq=False)
class Variant:
    op: str
    backend: str
    step: int
    name: str
    source: str  # repo-relative path of the step's kernel file
    dtypes: tuple  # torch dtypes this step accepts
    header: Header

    @property
    def qualname(self) -> str:
        """The torch op name: torch.ops.rosetta.<qualname>."""
        return f"{self.op}_{self.backend}_{self.step:02d}_{self.name}"

    @property
    def label(self) -> str:
        """`<op>/<backend>/<NN>_<name>`: the NVTX range name and the results key."""
        return f"{self.op}/{self.backend}/{self.step:02d}_{self.name}"

    def __call__(self, *inputs):
        from . import dispatch

        return dispatch.run(self, *inputs)

    def launch_into(self, *inputs, out):
        """Launch into a preallocated `out` (the bench times this: no allocation inside)."""
        from . import dispatch

        return dispatch.run_into(self, *inputs, out=out)

    def __repr__(self) -> str:
        return f"Variant({self.label})"


def _header_text(path: Path) -> str:
    text = path.read_text()
    if path.suffix == ".py":
        doc = ast.get_docstring(ast.parse(text), clean=True)
        if not doc:
            raise RegistryError(f"{path}: no module docstring with the step header")
        return doc
    match = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    if not match:
        raise RegistryError(f"{path}: the file must open with a /* ... */ step header")
    return match.group(1)


def parse_header(path: Path) -> tuple[int, Header]:
    """Parse `Step N — title` and the Changed/Why/Still/Limits fields (continuations indented)."""
    lines = [line.rstrip() for line in _header_text(path).strip().splitlines()]
    title = STEP_TITLE.match(lines[0].strip()) if lines else None
    if not title:
        raise RegistryError(f"{path}: header must start with 'Step N — title', got {lines[:1]}")
    fields: dict[str, list[str]] = {}
    current = None
    for line in lines[1:]:
        key, _, rest = line.partition(":")
        if key in HEADER_FIELDS and not line.startswith(" "):
            current = fields.setdefault(key, [])
            current.append(rest.strip())
        elif current is not None and line.strip():
            current.append(line.strip())
    missing = [f for f in HEADER_FIELDS if not fields.get(f)]
    if missing:
        raise RegistryError(f"{path}: header lacks {', '.join(missing)}")
    joined = {k.lower(): " ".join(v) for k, v in fields.items()}
    return int(title.group("num")), Header(title=title.group("title").strip(), **joined)


def step_files(backend: str, op: str) -> list[Path]:
    folder = KERNEL_DIRS[backend] / op
    return sorted(p for p in folder.glob(f"*{SUFFIXES[backend]}") if STEP_FILE.match(p.stem))


_REGISTRY: tuple[Variant, ...] | None = None


def _all_variants() -> tuple[Variant, ...]:
    """Discovered once, then a plain global read: torch.compile traces rosetta.vector_add & co.
    through here, and must see a constant, not file reads."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def _discover() -> tuple[Variant, ...]:
    from .ops import SPECS

    found = []
    for op in OPS:
        for backend in BACKENDS:
            for number, path in enumerate(step_files(backend, op), start=1):
                match = STEP_FILE.match(path.stem)
                if int(match["num"]) != number:
                    raise RegistryError(f"{path}: expected step {number:02d} (steps are contiguous)")
                header_step, header = parse_header(path)
                if header_step != number:
                    raise RegistryError(f"{path}: header says step {header_step}, file says {number}")
                if op not in SPECS:
                    raise RegistryError(f"{path}: op {op!r} has steps but no spec in bindings/ops/")
                found.append(
                    Variant(op=op, backend=backend, step=number, name=match["name"],
                            source=str(path.relative_to(REPO)), dtypes=SPECS[op].dtypes,
                            header=header)
                )
    return tuple(found)


def variants(op: str | None = None, backend: str | None = None) -> list[Variant]:
    """Every registered step, in (op, backend, step) order, optionally filtered."""
    if op is not None and op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    return [v for v in _all_variants()
            if (op is None or v.op == op) and (backend is None or v.backend == backend)]


def ops_with_steps() -> list[str]:
    """The ops that have at least one step file, in OPS order."""
    return [op for op in OPS if variants(op)]


def best(op: str, backend: str) -> Variant:
    """The step used when step=None: the last (most optimized) one of the ladder."""
    ladder = variants(op, backend)
    if not ladder:
        raise ValueError(f"{op} has no {backend} steps yet")
    return ladder[-1]


def select(op: str, backend: str, step: int | None) -> Variant:
    ladder = variants(op, backend)
    if step is None:
        return best(op, backend)
    if not isinstance(step, int) or not 1 <= step <= len(ladder):
        raise ValueError(f"{op}/{backend} has steps 1..{len(ladder)}, got step={step!r}")
    return ladder[step - 1]
