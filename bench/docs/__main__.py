"""python -m rosetta.bench.docs: plots, README/METHOD/KERNEL_LOG blocks and per-op pages, from the
committed results (no GPU needed). The site is `python -m rosetta.bench.docs.site`."""
from .report import regenerate

regenerate()
