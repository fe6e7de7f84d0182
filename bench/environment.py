"""Where results go and what they were measured on (GPU, driver, CUDA, torch, triton, git sha)."""
from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess

import torch

from rosetta.registry import REPO

RESULTS = REPO / "results"


def slug(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3': one results folder per GPU model."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def results_dir(gpu_name: str | None = None):
    name = gpu_name or torch.cuda.get_device_name()
    path = RESULTS / slug(name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_sha() -> str:
    """HEAD (+"-dirty"); ROSETTA_GIT_SHA names it where the tree was copied without .git."""
    if os.environ.get("ROSETTA_GIT_SHA"):
        return os.environ["ROSETTA_GIT_SHA"]
    sha = _run(["git", "rev-parse", "--short=12", "HEAD"]) or "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return sha + ("-dirty" if dirty else "")


def collect() -> dict:
    """The environment every results file carries."""
    import triton

    props = torch.cuda.get_device_properties(0)
    nvcc = re.search(r"release ([\d.]+)", _run(["nvcc", "--version"]))
    return {
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0],
        "cuda_runtime": torch.version.cuda,
        "nvcc": nvcc.group(1) if nvcc else "",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "git_sha": git_sha(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
    }
