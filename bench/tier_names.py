"""The names of the reference tiers, as results rows carry them in `backend` and `name`: shared by
the runners that measure the tiers (bench.run) and the documents that order and label them."""
from __future__ import annotations

TORCH_TIERS = ("eager", "compile", "unfused")  # unfused: only in the directions that declare one
LIBRARY_TIERS = {"cub": "device_reduce"}  # backend -> name: CUDA-library references
PEERS = ("liger",)  # peer libraries, measured when they import
ABLATION = "ablation"  # the backend of the ablation tiers: not a ladder step, so no step deltas
REFERENCE_BACKENDS = ("torch", *LIBRARY_TIERS, *PEERS, ABLATION)
