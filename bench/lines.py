"""Lines of code per step, device and host apart (lizard's NLOC: no blanks, comments, docstrings).

Device code: the bodies of `__global__`/`__device__` functions (CUDA) and `@triton.jit` functions
(Triton). Host code: everything else in the step file (launcher, grid and config choices, module
level). The shared binding (bindings/binding.cpp) is not attributed to any one step."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

_saved_path = list(sys.path)
import lizard  # noqa: E402 -- lizard puts the running script's folder first on sys.path at import,

sys.path[:] = _saved_path  # which would let bench/profile.py shadow the stdlib's `profile`

DEVICE_MARK = {".cu": re.compile(r"__global__|__device__"), ".py": re.compile(r"@triton\.jit")}


@dataclass(frozen=True)
class LineCount:
    device_nloc: int
    device_tokens: int
    host_nloc: int
    host_tokens: int


def _is_device(func, lines: list[str], suffix: str, floor: int) -> bool:
    """Look at the declaration above the function name (back to the previous function's end)."""
    start = func.start_line - 1
    prefix = lines[max(floor, start - 4):start + 1]
    if suffix == ".py":  # the decorators directly above `def`
        prefix = []
        i = start - 1
        while i >= 0 and lines[i].lstrip().startswith("@"):
            prefix.append(lines[i])
            i -= 1
    return any(DEVICE_MARK[suffix].search(line) for line in prefix)


def count(path: Path) -> LineCount:
    text = path.read_text()
    info = lizard.analyze_file.analyze_source_code(str(path), text)
    lines = text.splitlines()
    device_nloc = device_tokens = 0
    floor = 0
    for func in info.function_list:
        if _is_device(func, lines, path.suffix, floor):
            device_nloc += func.nloc
            device_tokens += func.token_count
        floor = func.end_line
    return LineCount(device_nloc, device_tokens, info.nloc - device_nloc, info.token_count - device_tokens)
