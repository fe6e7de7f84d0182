"""Every .cu compiles with plain nvcc for sm_90a (the flags torch's build uses) and spills nothing."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import rosetta
from rosetta import cuda_build, cuda_codegen

CU_FILES = sorted(cuda_build.CUDA_DIR.rglob("*.cu"))
NVCC = shutil.which("nvcc")
STEPS = {cuda_build.REPO / v.source: v for v in rosetta.variants(backend="cuda")}
MANGLED = {"float16": "6__half", "bfloat16": "13__nv_bfloat16"}  # how a kernel's name shows T


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """rosetta_ops.h (the per-op argument structs) as the build generates it."""
    folder = tmp_path_factory.mktemp("generated")
    cuda_build.write_generated(folder)
    return folder


def compile_cu(path, out_dir, generated):
    """nvcc as the extension build runs it: through a shim that sets the step's declared dtypes
    (nvcc would split a -D value at its commas)."""
    cubin = out_dir / (path.stem + ".cubin")
    shim = out_dir / f"{path.parent.name}__{path.name}"
    shim.write_text(cuda_build.shim_text(path, STEPS.get(path)))
    cmd = [NVCC, "-cubin", *cuda_build.NVCC_FLAGS, cuda_build.HOPPER_GENCODE,
           *cuda_build.TORCH_NVCC_DEFINES, f"-I{cuda_build.COMMON_DIR}", f"-I{generated}",
           "-Xptxas", "-v", str(shim), "-o", str(cubin)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"nvcc failed on {path}:\n{result.stderr}"
    return cubin, result.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_compiles_without_spills(tmp_path, generated, path):
    _, report = compile_cu(path, tmp_path, generated)
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    assert kernels, f"{path}: ptxas reported no kernels:\n{report}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(s == ("0", "0") for s in spills), f"{path} spills registers:\n{report}"
    undeclared = [t for t, m in MANGLED.items() if path in STEPS
                  and t not in {str(d).removeprefix("torch.") for d in STEPS[path].dtypes}
                  and any(m in k for k in kernels)]
    assert not undeclared, f"{path} instantiates {undeclared}, which its Dtypes line does not declare"


def test_generated_binding_covers_every_cuda_launcher():
    text = cuda_codegen.binding_include()
    for v in rosetta.variants(backend="cuda"):
        assert f'm.def("{v.qualname}_out(' in text
        assert f"cudaError_t {v.launcher_name}(const rosetta::" in text
    assert "struct SoftmaxBackwardArgs { Tensor y; Tensor dy; Tensor dx; Workspace workspace; };" in \
        cuda_codegen.ops_header()


def _cuobjdump():
    """The triton wheel ships cuobjdump (CI has nvcc but no CUDA toolkit binaries beside it)."""
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else shutil.which("cuobjdump")


CUOBJDUMP = _cuobjdump()


def sass_opcodes(cubin, kernel_substring):
    """The opcode sequence of the first kernel whose mangled name contains kernel_substring."""
    dump = subprocess.run([CUOBJDUMP, "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    opcodes, inside = [], False
    for line in dump.splitlines():
        if "Function :" in line:
            if inside:
                break
            inside = kernel_substring in line
        elif inside:
            match = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
            if match:
                opcodes.append(match.group(1))
    return opcodes


# Steps whose header claims an instruction pattern: (file, kernel, what must appear in the SASS).
SASS_CLAIMS = [
    # "issues all eight LDG.E.128 before the first FADD" (fp32 instantiation)
    ("reduce_sum/10_deep_loads.cu", "IfE", lambda ops: "LDG.E.128 " * 8 in " ".join(
        o for o in ops if o.startswith(("LDG", "FADD"))) + " "),
    # 128-bit loads and stores
    ("vector_add/03_vectorized.cu", "IfE", lambda ops: "LDG.E.128.CONSTANT" in ops and "STG.E.128" in ops),
    ("vector_add/04_unrolled_blocks.cu", "IfE", lambda ops: ops.count("LDG.E.128.CONSTANT") >= 8),
    # the shuffle tree
    ("reduce_sum/08_warp_shuffle.cu", "IfE", lambda ops: "SHFL.DOWN" in ops),
]


@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="nvcc or cuobjdump not available")
@pytest.mark.parametrize("source,kernel,claim", SASS_CLAIMS, ids=[c[0] for c in SASS_CLAIMS])
def test_sass_claims(tmp_path, generated, source, kernel, claim):
    cubin, _ = compile_cu(cuda_build.CUDA_DIR / source, tmp_path, generated)
    ops = sass_opcodes(cubin, kernel)
    assert ops, f"no kernel matching {kernel!r} in {source}"
    assert claim(ops), f"{source}: SASS does not show what the header claims:\n{' '.join(ops[:200])}"


def test_survey_fma_kernel_is_ffma(tmp_path, generated):
    """The FP32 peak microbenchmark must run FFMA: 16 x 8 of them in its loop body."""
    if NVCC is None or CUOBJDUMP is None:
        pytest.skip("nvcc or cuobjdump not available")
    from rosetta.survey import measure

    cubin, _ = compile_cu(measure.KERNELS, tmp_path, generated)
    assert sass_opcodes(cubin, "fma_chains").count("FFMA") >= 128
