"""Build every .cu under cuda-kernels/ into one torch extension (cpp_extension + ninja), once.

What the binding needs per op and per step is generated (bindings/cuda_codegen.py), so no
declaration is kept by hand. The build lives in .build/ and ninja rebuilds only what changed.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import cuda_codegen
from .steps import CHECKOUT, KERNEL_DIRS, REPO, all_steps

CUDA_DIR = KERNEL_DIRS["cuda"]
COMMON_DIR = CUDA_DIR / "common"
BINDING = Path(__file__).with_name("binding.cpp")
# In a checkout beside the sources; from an installed wheel in the user's cache.
BUILD_ROOT = REPO / ".build" if CHECKOUT else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kernel-rosetta"
_module = None  # the built extension: a Python module whose functions are the launchers
HOPPER_GENCODE = "-gencode=arch=compute_90a,code=sm_90a"
# What torch's cpp_extension adds to every nvcc call; CI's plain-nvcc compile check uses the same.
TORCH_NVCC_DEFINES = [
    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
]
NVCC_FLAGS = ["-O3", "-lineinfo", "-std=c++17"]


class CudaBuildError(RuntimeError):
    """nvcc or the linker failed; the message holds the compiler output and the file."""


def arch_flags(capability: tuple[int, int]) -> tuple[str, list[str]]:
    """(TORCH_CUDA_ARCH_LIST, gencode flags): sm_90a on Hopper, the GPU's own arch + PTX elsewhere."""
    if capability == (9, 0):
        return "9.0a", [HOPPER_GENCODE]
    major, minor = capability
    arch = f"{major}{minor}"
    return f"{major}.{minor}+PTX", [f"-gencode=arch=compute_{arch},code=sm_{arch}",
                                    f"-gencode=arch=compute_{arch},code=compute_{arch}"]


def write_generated(folder: Path) -> None:
    """rosetta_ops.h and rosetta_binding.inc, rewritten only when their text changes."""
    folder.mkdir(parents=True, exist_ok=True)
    _write_if_changed(folder / "rosetta_ops.h", cuda_codegen.ops_header())
    _write_if_changed(folder / "rosetta_binding.inc", cuda_codegen.binding_include())


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:  # unchanged files keep ninja from rebuilding
        path.write_text(text)


def _sources(build_dir: Path) -> list[str]:
    """The binding plus one shim per .cu: torch names objects by basename, and every op has a
    01_*.cu, so each file is compiled through `<op>__<stem>.cu`, which sets the step's declared
    dtypes and #includes it (nvcc errors and -lineinfo still point at the real file)."""
    steps = {REPO / s.source: s for s in all_steps() if s.backend == "cuda"}
    sources = [str(BINDING)]
    for cu in sorted(CUDA_DIR.rglob("*.cu")):
        shim = build_dir / f"{cu.parent.name}__{cu.stem}.cu"
        _write_if_changed(shim, shim_text(cu, steps.get(cu)))
        sources.append(str(shim))
    return sources


def shim_text(cu: Path, step=None) -> str:
    """The file nvcc compiles for `cu`: the step's declared dtypes, then the step itself."""
    return f'#define ROSETTA_DTYPES {cuda_codegen.dtype_macro(step)}\n#include "{cu}"\n'


def load(verbose: bool = False):
    """Build (or reuse) the extension and load it: the returned module has every launcher as a
    function, `module.<op name>_out(inputs..., out)`."""
    global _module
    if _module is not None:
        return _module
    import torch
    from torch.utils import cpp_extension

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA steps need a CUDA GPU and a CUDA build of torch "
                           f"(torch {torch.__version__}, cuda available: False)")
    capability = torch.cuda.get_device_capability()
    arch_list, gencode = arch_flags(capability)
    build_dir = BUILD_ROOT / f"torch{torch.__version__}-sm{capability[0]}{capability[1]}"
    write_generated(build_dir)
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list  # so torch adds no second, different target
    try:
        _module = cpp_extension.load(
            name="rosetta_cuda",
            sources=_sources(build_dir),
            extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=NVCC_FLAGS + gencode,
            extra_include_paths=[str(COMMON_DIR), str(build_dir)],
            build_directory=str(build_dir),
            is_python_module=True,
            verbose=verbose,
        )
    except Exception as err:  # cpp_extension raises RuntimeError with ninja's output attached
        raise CudaBuildError(f"building the CUDA steps in {build_dir} failed:\n{err}") from err
    return _module
