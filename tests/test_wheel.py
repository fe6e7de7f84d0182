"""A built (non-editable) wheel installs and works outside the checkout: the registry finds every
step and the binding source, because the wheel ships them."""
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import rosetta

REPO = rosetta.registry.REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built from a copy of the sources, so the build leaves nothing in the checkout."""
    src, out = tmp_path_factory.mktemp("src") / "kernel-rosetta", tmp_path_factory.mktemp("dist")
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".build", ".whl", "build", "results", "*.egg-info", "__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(out), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = out.glob("kernel_rosetta-*.whl")
    return path


def test_every_kernel_folder_is_a_declared_package():
    """pyproject lists each kernel folder as a (data) package: one missing is shipped with a
    setuptools warning at every install, or not at all."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {f"rosetta.{root.replace('-', '_')}.{sub.name}" for root in ("cuda-kernels", "triton-kernels")
               for sub in (REPO / root).iterdir() if sub.is_dir() and not sub.name.startswith(("_", "."))}
    assert on_disk <= declared, f"declare these in pyproject.toml's packages: {sorted(on_disk - declared)}"


def test_wheel_ships_what_the_registry_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for v in rosetta.variants():
        folder = "rosetta/cuda_kernels/" if v.backend == "cuda" else "rosetta/triton_kernels/"
        assert folder + v.source.split("/", 1)[1] in names, f"{v.source} is not in the wheel"
    assert {"rosetta/binding.cpp", "rosetta/ops/softmax.py", "rosetta/cuda_kernels/common/rosetta.cuh"} <= names


def test_wheel_installs_in_a_fresh_venv_and_lists_the_variants(wheel, tmp_path):
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # torch & co. from this interpreter's site-packages (a plain path: its .pth files, among them
    # the editable install of this checkout, are not processed there)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                                "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True)
    if installed.returncode != 0 and "no such option: --python" in installed.stderr:
        pytest.skip("pip too old for --python")
    assert installed.returncode == 0, installed.stderr[-3000:]
    listing = subprocess.run(
        [python, "-c", "import rosetta; print(rosetta.__file__); "
                       "print(len(rosetta.variants())); [print(v.label) for v in rosetta.variants()]"],
        capture_output=True, text=True, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr[-3000:]
    location, count, *labels = listing.stdout.split()
    assert location.startswith(str(env)), f"imported {location}, not the installed wheel"
    assert labels == [v.label for v in rosetta.variants()] and int(count) == len(labels)
