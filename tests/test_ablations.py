"""The ablation patches in bench/ablations still apply to the steps they switch (a step rewritten
after its ablations were made would otherwise leave a patch that fails on the GPU box)."""
import shutil
import subprocess

import pytest

from rosetta.registry import REPO

PATCHES = sorted((REPO / "bench" / "ablations").glob("*.patch"))


def in_git_checkout() -> bool:
    return shutil.which("git") is not None and subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--is-inside-work-tree"], capture_output=True).returncode == 0


@pytest.mark.skipif(not in_git_checkout(), reason="needs git and a checkout of the repository")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_ablation_patch_applies_to_the_current_step(patch):
    check = subprocess.run(["git", "-C", str(REPO), "apply", "--check", str(patch)], capture_output=True, text=True)
    assert check.returncode == 0, f"{patch.name} no longer applies; remake it against the step:\n{check.stderr}"
