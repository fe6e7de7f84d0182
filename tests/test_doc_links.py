"""Every relative link in the docs resolves: README, KERNEL_LOG, the method page and the generated
per-op and suite pages (a moved file or a renamed plot breaks a link silently otherwise)."""
import re

import pytest

import rosetta

REPO = rosetta.registry.REPO
DOCS = [REPO / "README.md", REPO / "KERNEL_LOG.md", REPO / "bench" / "METHOD.md",
        *sorted((REPO / "results").glob("*/*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: links to nothing: {sorted(set(broken))[:10]}"
