"""The ablation patches in bench/ablations still apply to the steps they switch (a step rewritten
after its ablations were made would otherwise leave a patch that fails on the GPU box)."""
import shutil
import subprocess

import pytest

from rosetta.registry import REPO

PATCHES = sorted((REPO / "bench" / "ablations").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git (git apply works without a checkout)")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_ablation_patch_applies_to_the_current_step(patch):
    check = subprocess.run(["git", "-C", str(REPO), "apply", "--check", str(patch)], capture_output=True, text=True)
    assert check.returncode == 0, f"{patch.name} no longer applies; remake it against the step:\n{check.stderr}"
