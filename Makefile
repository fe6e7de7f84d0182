# kernel-rosetta. On a fresh machine: `make setup && make test`. On the GPU box: `make bench`.
# The GPU box has its own interpreter with torch/triton installed: `make PY=python3 test-gpu bench`.
VENV ?= .venv
PY ?= $(VENV)/bin/python
PYTEST = $(PY) -m pytest
BENCH = PYTHONUNBUFFERED=1 $(PY) -m rosetta.bench

.PHONY: setup test test-gpu bench bench-quick bench-changed bench-suite bench-overhead flush-check profile sanitize survey docs site screenshot clean

# torch==2.13.0 is the CPU build on machines without a GPU (a plain `torch` would pull a multi-GB
# CUDA build); triton 3.6.0 is the reference GPU's, so the interpreter runs the same Triton there;
# numpy<2.4 because triton 3.6's interpreter breaks on runtime-bounded range() with numpy>=2.4.
# Every editable install makes setuptools print a notice (UserWarning "Editable installation ... be
# careful with folders of the package's name"): said here once, silenced there.
# The site's headless-browser test needs Chromium: where none is on PATH, Debian's `chromium` is
# installed through apt (as root, or with sudo); where that cannot be done, setup says so and goes on
# (the test then fails unless ROSETTA_NO_BROWSER=1).
setup:
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q "torch==2.13.0" "triton==3.6.0" "numpy<2.4"
	PYTHONWARNINGS="ignore::UserWarning" $(VENV)/bin/python -m pip install -q -e ".[test]"
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else SUDO=no; fi; \
	  if [ "$$SUDO" != no ] && command -v apt-get >/dev/null 2>&1 \
	     && $$SUDO apt-get update -qq \
	     && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
	     && command -v chromium >/dev/null 2>&1; then \
	    echo "setup: installed Debian's chromium for the site's headless-browser test"; \
	  else \
	    echo "setup: could not install chromium (needs apt-get, and root or sudo): the site's headless-browser" \
	         "test (tests/test_site.py) needs it and fails without it; install chromium, or set ROSETTA_NO_BROWSER=1 to skip it" >&2; \
	  fi; }

# CPU: Triton under the interpreter, nvcc + SASS checks, registry, harness logic, API errors,
# the wheel, and property-based fuzzing (bounded: fixed seed, time budget).
test:
	TRITON_INTERPRET=1 $(PYTEST) -m "not gpu" -q

# GPU: every step x dtype x direction x shape against fp64, autograd, compile, opcheck, fuzzing.
# `slow`: >= 2^31 elements.
# pytest-xdist's workers where it is installed (~2,000 GPU tests: ~16 min on 12 of them); the
# tests share the GPU's memory between workers (tests/conftest.py). GPU_WORKERS= runs them in one process.
GPU_WORKERS ?= $(shell $(PY) -c "import xdist" 2>/dev/null && echo 12)
test-gpu:
	$(PYTEST) -m "gpu" -q $(if $(GPU_WORKERS),-n $(GPU_WORKERS)) $(PYTEST_ARGS)

bench:
	$(BENCH)

bench-quick:
	$(BENCH) --quick

# Only the ops with a step whose code changed since the run that measured its rows, each whole.
bench-changed:
	$(BENCH) --changed

# The shapes users bring: every step on each, the dispatch table step=None reads (dispatch.json),
# suite.md and heatmaps. In parts of a few minutes each: `make bench-suite SUITE_OPS="--op matmul --dtype bfloat16"`
# (add `--backend triton` to re-run one backend: the other keeps its rows and their torch reference).
bench-suite:
	$(BENCH) --suite $(SUITE_OPS)

# Host cost per call on a tiny input: torch, each backend's public call, the layers under it.
bench-overhead:
	$(BENCH) --overhead

# The flush comparison README shows: zeroing flush vs read-only flush vs sustained back-to-back.
flush-check:
	$(BENCH) --flush-check

# Nsight Compute over every step (clocks untouched), parsed into results/<gpu>/ncu.csv.
profile:
	PYTHONUNBUFFERED=1 $(PY) -m rosetta.bench.profiling
	$(PY) -m rosetta.bench.docs

# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every step -> sanitize.md.
sanitize:
	PYTHONUNBUFFERED=1 $(PY) -m rosetta.bench.sanitize

# Measured ceilings of this GPU (copy/read/write bandwidth, FP32 FMA, tensor cores) and the roofline.
survey:
	PYTHONUNBUFFERED=1 $(PY) -m rosetta.survey

# README/KERNEL_LOG tables, measured figures in their prose, per-op pages and plots, regenerated
# from the committed results (no GPU needed).
docs:
	$(PY) -m rosetta.bench.docs

# A static site (site/index.html, one page per op) from the registry, the step files and the
# committed results (no GPU needed).
site:
	$(PY) -m rosetta.bench.docs.site

# README's picture of the report's overview page, taken by headless Chromium from the site just built.
SCREENSHOT = $(firstword $(wildcard results/*/plots/report_screenshot.png))
screenshot: site
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1366,1000 \
	  --screenshot=$(SCREENSHOT) "file://$(CURDIR)/site/index.html"

clean:
	rm -rf .build .pytest_cache build dist site
