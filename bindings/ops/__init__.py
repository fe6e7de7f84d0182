"""The op specs, discovered: every module here with a SPEC is an op (adding an op adds a module);
`spec` and modules named _<...> hold what several ops share."""
import importlib
import pkgutil

from .spec import Direction, Headline, OpSpec

_found = [importlib.import_module(f"{__name__}.{m.name}").SPEC
          for m in pkgutil.iter_modules(__path__) if m.name != "spec" and not m.name.startswith("_")]
SPECS: dict[str, OpSpec] = {s.name: s for s in sorted(_found, key=lambda s: s.position)}
OPS: tuple[str, ...] = tuple(SPECS)

__all__ = ["SPECS", "OPS", "OpSpec", "Direction", "Headline"]
