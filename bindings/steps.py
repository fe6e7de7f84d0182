"""Step discovery: every file `<backend-dir>/<op>/<NN>_<name>.<cu|py>` is a Step record.

Nothing here is a hand-kept list. A step's header (Step/Changed/Why/Still/Limits, and optionally
Roofline/Dtypes/Layout/Max/Min/Mirrors/Hazard/Slower) is parsed from the file's leading comment or docstring: what a step
takes is declared once, in its own file. Steps are plain records; running one is dispatch's job.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .ops import OPS, SPECS
from .ops.spec import LAYOUTS

_CHECKOUT = Path(__file__).resolve().parent.parent
CHECKOUT = (_CHECKOUT / "cuda-kernels").is_dir()  # a source checkout (or an editable install of one)
if CHECKOUT:
    REPO = _CHECKOUT
    KERNEL_DIRS = {"cuda": REPO / "cuda-kernels", "triton": REPO / "triton-kernels"}
else:  # an installed wheel: the kernel folders are subpackages of rosetta
    REPO = Path(__file__).resolve().parent
    KERNEL_DIRS = {"cuda": REPO / "cuda_kernels", "triton": REPO / "triton_kernels"}
BACKENDS = ("cuda", "triton")
SUFFIXES = {"cuda": ".cu", "triton": ".py"}

STEP_FILE = re.compile(r"^(?P<num>\d\d)_(?P<name>[a-z0-9_]+)$")
STEP_TITLE = re.compile(r"^Step\s+(?P<num>\d+)\s*[—-]+\s*(?P<title>.+)$")
REQUIRED_FIELDS = ("Changed", "Why", "Still", "Limits")
OPTIONAL_FIELDS = ("Roofline", "Dtypes", "Layout", "Max", "Min", "Mirrors", "Hazard", "Slower")
BOUNDS = {"Max": ("<=", re.compile(r"^(?P<quantity>\w+)\s*<=\s*(?P<limit>[\d_,]+)$")),
          "Min": (">=", re.compile(r"^(?P<quantity>\w+)\s*>=\s*(?P<limit>[\d_,]+)$"))}


class RegistryError(RuntimeError):
    """A step file breaks the layout contract (name, header, numbering)."""


@dataclass(frozen=True)
class Header:
    title: str
    changed: str
    why: str
    still: str
    limits: str
    mirrors: str = ""
    roofline: str = ""  # the bound each level (global, shared, registers) puts on the step


@dataclass(frozen=True, eq=False)
class Step:
    op: str
    backend: str
    step: int
    name: str
    source: str  # repo-relative path of the step's kernel file
    dtypes: tuple  # torch dtypes this step takes (its `Dtypes:` line, else the op's)
    layout: str  # what the kernel assumes about strides: one of ops.spec.LAYOUTS
    bounds: tuple  # ((quantity, max), ...) from its `Max:` line, checked before launch
    header: Header
    hazard: str = ""  # its `Hazard:` line: a known way it goes wrong, so step=None passes it over
    # ((quantity, min), ...) from its `Min:` line: a step meant for long rows says where it starts
    # (the shapes below are another step's business: the dispatcher's, never this step's)
    minimums: tuple = ()
    # its `Slower:` line: measured slower than an earlier step wherever it was timed, kept for its
    # lesson; without a measured table step=None passes it over (the table, where there is one, ranks it)
    slower: str = ""

    @property
    def qualname(self) -> str:
        """The torch op name: torch.ops.rosetta.<qualname>."""
        return f"{self.op}_{self.backend}_{self.step:02d}_{self.name}"

    @property
    def label(self) -> str:
        """`<op>/<backend>/<NN>_<name>`: the NVTX range name and the results key."""
        return f"{self.op}/{self.backend}/{self.step:02d}_{self.name}"

    @property
    def launcher_name(self) -> str:
        """The CUDA launcher's C++ name: <op>_<NN>_<name>."""
        return f"{self.op}_{self.step:02d}_{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label})"


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


def parse_header(path: Path) -> tuple[int, dict[str, str]]:
    """`Step N — title` and the header fields (continuation lines indented) of a step file."""
    lines = [line.rstrip() for line in _header_text(path).strip().splitlines()]
    title = STEP_TITLE.match(lines[0].strip()) if lines else None
    if not title:
        raise RegistryError(f"{path}: header must start with 'Step N — title', got {lines[:1]}")
    fields: dict[str, list[str]] = {}
    current = None
    for line in lines[1:]:
        key, _, rest = line.partition(":")
        if key in REQUIRED_FIELDS + OPTIONAL_FIELDS and not line.startswith(" "):
            current = fields.setdefault(key, [])
            current.append(rest.strip())
        elif current is not None and line.strip():
            current.append(line.strip())
    missing = [f for f in REQUIRED_FIELDS if not fields.get(f)]
    if missing:
        raise RegistryError(f"{path}: header lacks {', '.join(missing)}")
    return int(title.group("num")), {"title": title.group("title").strip(),
                                     **{k: " ".join(v) for k, v in fields.items()}}


def _dtypes(path, text: str | None, default: tuple) -> tuple:
    if not text:
        return default
    found = []
    for name in (n.strip() for n in text.split(",")):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or dtype not in default:
            raise RegistryError(f"{path}: Dtypes names {name!r}; expected some of "
                                f"{[str(d).removeprefix('torch.') for d in default]}")
        found.append(dtype)
    return tuple(found)


def _bounds(path, text: str | None, spec, field: str = "Max") -> tuple:
    if not text:
        return ()
    relation, pattern = BOUNDS[field]
    bounds = []
    for part in text.split(";"):
        match = pattern.match(part.strip())
        if not match or match["quantity"] not in spec.bounds:
            raise RegistryError(f"{path}: {field} must read '<quantity> {relation} <number>' with a quantity of "
                                f"{sorted(spec.bounds)}, got {part.strip()!r}")
        bounds.append((match["quantity"], int(match["limit"].replace(",", "").replace("_", ""))))
    return tuple(bounds)


def step_files(backend: str, op: str) -> list[Path]:
    folder = KERNEL_DIRS[backend] / op
    return sorted(p for p in folder.glob(f"*{SUFFIXES[backend]}") if STEP_FILE.match(p.stem))


_FOUND: tuple[Step, ...] | None = None


def all_steps() -> tuple[Step, ...]:
    """discover(), once."""
    global _FOUND
    if _FOUND is None:
        _FOUND = discover()
    return _FOUND


def discover() -> tuple[Step, ...]:
    """Every step of every op, in (op, backend, step) order. Step folders of an op without a spec
    are an error, not silently skipped."""
    for backend, folder in KERNEL_DIRS.items():
        for sub in folder.iterdir():
            if sub.is_dir() and not sub.name.startswith(("_", ".")) and sub.name != "common" \
                    and sub.name not in OPS and step_files(backend, sub.name):
                raise RegistryError(f"{sub}: op {sub.name!r} has steps but no spec in bindings/ops/")
    found = []
    for op in OPS:
        spec = SPECS[op]
        for backend in BACKENDS:
            for number, path in enumerate(step_files(backend, op), start=1):
                match = STEP_FILE.match(path.stem)
                if int(match["num"]) != number:
                    raise RegistryError(f"{path}: expected step {number:02d} (steps are contiguous)")
                header_step, fields = parse_header(path)
                if header_step != number:
                    raise RegistryError(f"{path}: header says step {header_step}, file says {number}")
                layout = fields.get("Layout", spec.layout)
                if layout not in LAYOUTS:
                    raise RegistryError(f"{path}: Layout must be one of {LAYOUTS}, got {layout!r}")
                header = Header(title=fields["title"], changed=fields["Changed"], why=fields["Why"],
                                still=fields["Still"], limits=fields["Limits"],
                                mirrors=fields.get("Mirrors", ""), roofline=fields.get("Roofline", ""))
                found.append(Step(op=op, backend=backend, step=number, name=match["name"],
                                  source=str(path.relative_to(REPO)),
                                  dtypes=_dtypes(path, fields.get("Dtypes"), spec.dtypes),
                                  layout=layout, bounds=_bounds(path, fields.get("Max"), spec),
                                  header=header, hazard=fields.get("Hazard", ""),
                                  minimums=_bounds(path, fields.get("Min"), spec, "Min"),
                                  slower=fields.get("Slower", "")))
    return tuple(found)
