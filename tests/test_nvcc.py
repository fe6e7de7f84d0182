"""Every .cu compiles with plain nvcc for sm_90a (the flags torch's build uses) and spills nothing."""
import re
import shutil
import subprocess

import pytest

from rosetta import cuda_build

CU_FILES = sorted(cuda_build.CUDA_DIR.rglob("*.cu"))
NVCC = shutil.which("nvcc")


def compile_cu(path, out_dir):
    cubin = out_dir / (path.stem + ".cubin")
    cmd = [NVCC, "-cubin", *cuda_build.NVCC_FLAGS, cuda_build.HOPPER_GENCODE,
           *cuda_build.TORCH_NVCC_DEFINES, f"-I{cuda_build.COMMON_DIR}", "-Xptxas", "-v",
           str(path), "-o", str(cubin)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"nvcc failed on {path}:\n{result.stderr}"
    return cubin, result.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_compiles_without_spills(tmp_path, path):
    _, report = compile_cu(path, tmp_path)
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    assert kernels, f"{path}: ptxas reported no kernels:\n{report}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(s == ("0", "0") for s in spills), f"{path} spills registers:\n{report}"


def test_steps_header_lists_every_cuda_step():
    header = cuda_build.steps_header()
    assert "X(vector_add, 01_naive)" in header
    assert header.count("X(") == len([v for v in __import__("rosetta").variants(backend="cuda")])
