"""Modules import downward only: no cycle among the modules of bindings/, bench/ and
hardware-survey/ (function-local imports included), the survey never imports the bench, and the
bench's subpackages keep their layers (LAYERS)."""
import ast
from pathlib import Path

import rosetta

REPO = rosetta.registry.REPO
PACKAGES = {"bindings": "rosetta", "bench": "rosetta.bench", "hardware-survey": "rosetta.survey"}
# bench/'s jobs, bottom to top: a subpackage imports its own modules, lower layers and the shared
# modules at bench/'s root (results I/O, environment, ceilings, line counts), never a higher layer;
# the root modules import no subpackage. Only the command line (bench/__main__.py) sees them all.
LAYERS = {"rosetta.bench.run": 1, "rosetta.bench.profiling": 2, "rosetta.bench.sanitize": 2, "rosetta.bench.ablations": 2,
          "rosetta.bench.docs": 3}


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


def layer(module: str) -> int:
    """0 for bench's root modules; a subpackage's layer; None outside the bench."""
    if not module.startswith("rosetta.bench"):
        return None
    return next((n for pkg, n in LAYERS.items() if module == pkg or module.startswith(pkg + ".")), 0)


def test_the_bench_subpackages_import_downward_only():
    mods = modules()
    wrong = []
    for name, path in mods.items():
        mine = layer(name)
        if mine is None or name == "rosetta.bench.__main__":
            continue
        for dep in imports(name, path, set(mods)):
            theirs = layer(dep)
            same_package = theirs == mine and (mine == 0 or dep.split(".")[:3] == name.split(".")[:3])
            if theirs is not None and theirs >= mine and not same_package and dep != "rosetta.bench":
                wrong.append(f"{name} imports {dep}")
    assert not wrong, "bench layers broken: " + "; ".join(wrong)
    assert all(any(m.startswith(pkg + ".") for m in mods) for pkg in LAYERS), "a layer named here is not in bench/"
