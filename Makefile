# kernel-rosetta. On a fresh machine: `make setup && make test`. On the GPU box: `make bench`.
# The GPU box has its own interpreter with torch/triton installed: `make PY=python3 test-gpu bench`.
VENV ?= .venv
PY ?= $(VENV)/bin/python
PYTEST = $(PY) -m pytest
BENCH = PYTHONUNBUFFERED=1 $(PY) -m rosetta.bench

.PHONY: setup test test-gpu bench bench-quick profile survey log clean

# torch==2.13.0 is the CPU build on machines without a GPU (a plain `torch` would pull a multi-GB
# CUDA build); triton 3.6.0 is the reference GPU's, so the interpreter runs the same Triton there;
# numpy<2.4 because triton 3.6's interpreter breaks on runtime-bounded range() with numpy>=2.4.
setup:
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q "torch==2.13.0" "triton==3.6.0" "numpy<2.4"
	$(VENV)/bin/python -m pip install -q -e ".[test]"

# CPU: Triton under the interpreter, nvcc compile checks, registry, harness logic, API errors.
test:
	TRITON_INTERPRET=1 $(PYTEST) -m "not gpu" -q

# GPU: every step x dtype x size against fp64, torch.compile + opcheck. `slow`: >= 2^31 elements.
test-gpu:
	$(PYTEST) -m "gpu" -q

bench:
	$(BENCH)

bench-quick:
	$(BENCH) --quick

# Nsight Compute over every step (clocks untouched), parsed into results/<gpu>/ncu.csv.
profile:
	PYTHONUNBUFFERED=1 $(PY) -m rosetta.bench.profile

# Measured ceilings of this GPU (copy/read/L2 bandwidth, FP32 FMA, cuBLAS) and the roofline.
survey:
	PYTHONUNBUFFERED=1 $(PY) -m rosetta.survey

# Regenerate README/KERNEL_LOG tables and plots from the committed results (no GPU needed).
log:
	$(PY) -m rosetta.bench.report

clean:
	rm -rf .build .pytest_cache
