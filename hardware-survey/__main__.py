"""`make survey`: what this GPU can do, measured -> results/<gpu>/hardware.json, hardware.md and
plots/roofline.png (the roofline is redrawn by `make docs` whenever bench results change).
The survey never imports rosetta.bench: the bench reads the survey's files, not the other way."""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

import torch

from . import best, measure
from . import facts as device_facts

TIMING = ("rosetta.timing, as the bench: each call captured as a CUDA graph, the L2 flushed before "
          "every replay by reading a buffer of 4x the L2 twice (a clean flush: no write-back billed to the "
          "probe), median over >= 5 replays (100 ms of them); the rate is work / median time; compute "
          "probes are timed three times and the fastest median kept (the clock moves with power and heat)")


def survey() -> dict:
    from rosetta import timing

    f = device_facts.collect()
    print(f"{f['name']}: {f['sm_count']} SMs, {f['l2_bytes'] / 2**20:.0f} MiB L2, "
          f"torch agrees: {f['torch_agrees']}", flush=True)
    probes = measure.Probes(timing.Flush("read"))
    for title, run in (("bandwidth", measure.bandwidth), ("compute", measure.compute)):
        t0 = time.monotonic()
        print(f"{title} probes:", flush=True)
        try:
            run(probes)
        except Exception as exc:  # e.g. out of memory allocating the buffers: the other group still runs
            print(f"  {title} probes stopped: {type(exc).__name__}: {exc}", flush=True)
            probes.found[f"{title}_setup"] = {"ceiling": None, "status": f"failed: {type(exc).__name__}: {exc}"[:300]}
        torch.cuda.empty_cache()
        print(f"  done in {time.monotonic() - t0:5.1f} s", flush=True)
    hw = {"facts": f, "theoretical": device_facts.theoretical_peaks(f), "probes": probes.found,
          "methods": {"timing": TIMING}}
    hw["ceilings"] = best.ceilings(hw)  # derived, for readers of the file; code recomputes it from probes
    return hw


def _git_sha(repo) -> str:
    if os.environ.get("ROSETTA_GIT_SHA"):
        return os.environ["ROSETTA_GIT_SHA"]
    try:
        run = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=repo, timeout=30).stdout.strip()  # noqa: E731
        return (run("rev-parse", "--short=12", "HEAD") or "unknown") + \
            ("-dirty" if run("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> int:
    if not torch.cuda.is_available():
        print("make survey needs a CUDA GPU; the committed surveys are under results/*/hardware.md")
        return 0
    from rosetta.registry import REPO

    from .report import markdown
    from .roofline import plot, read_rows

    hw = survey()
    hw["environment"] = {"python": platform.python_version(), "git_sha": _git_sha(REPO),
                         "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")}
    # the same folder name the bench uses: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'
    out = REPO / "results" / re.sub(r"[^a-z0-9]+", "-", hw["facts"]["name"].lower()).strip("-")
    out.mkdir(parents=True, exist_ok=True)
    (out / "hardware.json").write_text(json.dumps(hw, indent=2) + "\n")
    (out / "hardware.md").write_text(markdown(hw))
    try:
        plot(hw, read_rows(out / "bench.csv"), out / "plots" / "roofline.png")
    except Exception as exc:  # the ceilings are written; a plot failure must not hide them
        print(f"roofline not drawn: {type(exc).__name__}: {exc}")
    print("ceilings: " + "; ".join(f"{k} {c['value']:.1f} {c['unit']} ({c['probe']})"
                                   for k, c in hw["ceilings"].items() if c["value"]) + f" -> {out}/hardware.json")
    failed = [k for k, p in hw["probes"].items() if p["status"] != "ok"]
    if failed:
        print(f"FAILED probes (the ceilings are the best of the others): {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
