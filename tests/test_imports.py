"""Modules import downward only: no cycle among the modules of bindings/, bench/ and
hardware-survey/ (function-local imports included), and the survey never imports the bench."""
import ast
from pathlib import Path

import rosetta

REPO = rosetta.registry.REPO
PACKAGES = {"bindings": "rosetta", "bench": "rosetta.bench", "hardware-survey": "rosetta.survey"}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every rosetta module `name` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def test_no_import_cycles_and_the_survey_stays_below_the_bench():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert not [m for m in graph if m.startswith("rosetta.survey") and
                any(d.startswith("rosetta.bench") for d in graph[m])], "the survey imports the bench"
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for dep in graph[node]:
            if dep.rsplit(".", 1)[0] == node or node == "rosetta":  # a package's own __init__ re-exports
                continue
            if state.get(dep) == "open":
                raise AssertionError(f"import cycle: {' -> '.join(stack + [dep])}")
            if dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
