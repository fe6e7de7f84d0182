"""Lines of code per step, device and host apart (lizard's NLOC: no blanks, comments, docstrings).

Device code: the bodies of `__global__`/`__device__` functions (CUDA) and `@triton.jit` functions
(Triton). Host code: everything else in the step file (launcher, grid and config choices, module
level). The shared binding (bindings/binding.cpp) is not attributed to any one step."""
from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

_saved_path = list(sys.path)
import lizard  # noqa: E402 -- lizard puts the running script's folder first on sys.path at import,

sys.path[:] = _saved_path  # which would let a folder there shadow the stdlib's `profile`

DEVICE_MARK = {".cu": re.compile(r"__global__|__device__"), ".py": re.compile(r"@triton\.jit")}


@dataclass(frozen=True)
class LineCount:
    device_nloc: int
    device_tokens: int
    host_nloc: int
    host_tokens: int


def _preamble(func, lines: list[str], suffix: str, floor: int) -> list[str]:
    """Code lines above lizard's span (which starts at the function's name) that belong to the
    declaration: decorators in Python; `template <...>` and `__global__ ...` lines in CUDA."""
    found, i = [], func.start_line - 2
    while i >= floor:
        text = lines[i].strip()
        if suffix == ".py":
            keep = text.startswith("@")
        else:
            keep = bool(text) and not text.startswith(("//", "#", "}")) and not text.endswith((";", "}", "*/"))
        if not keep:
            break
        found.append(lines[i])
        i -= 1
    return found


def _is_device(func, lines: list[str], suffix: str, preamble: list[str]) -> bool:
    """Python: a @triton.jit decorator. CUDA: __global__/__device__ in the declaration."""
    head = preamble + lines[func.start_line - 1:func.start_line]
    return any(DEVICE_MARK[suffix].search(line) for line in head)


@functools.cache  # per process: the bench asks once per measured row
def count(path: Path) -> LineCount:
    text = path.read_text()
    info = lizard.analyze_file.analyze_source_code(str(path), text)
    lines = text.splitlines()
    device_nloc = device_tokens = floor = 0
    for func in info.function_list:
        preamble = _preamble(func, lines, path.suffix, floor)
        if _is_device(func, lines, path.suffix, preamble):
            device_nloc += func.nloc + len(preamble)
            device_tokens += func.token_count
        floor = func.end_line
    return LineCount(device_nloc, device_tokens, info.nloc - device_nloc, info.token_count - device_tokens)
