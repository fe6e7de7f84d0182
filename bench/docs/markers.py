"""Generated blocks inside hand-written Markdown: `<!-- rosetta:begin NAME -->` ... `<!-- rosetta:end NAME -->`.
Only the text between a pair is rewritten, so prose around it survives, and rewriting with the
same data changes nothing."""
from __future__ import annotations

import re


def begin(name: str) -> str:
    return f"<!-- rosetta:begin {name} -->"


def end(name: str) -> str:
    return f"<!-- rosetta:end {name} -->"


def block(name: str, content: str) -> str:
    return f"{begin(name)}\n{content.strip()}\n{end(name)}"


def names(text: str) -> list[str]:
    return re.findall(r"<!-- rosetta:begin (\S+) -->", text)


def replace(text: str, name: str, content: str) -> str:
    """Replace the block `name`'s content; raises KeyError if the markers are absent."""
    pattern = re.compile(re.escape(begin(name)) + r".*?" + re.escape(end(name)), re.S)
    if not pattern.search(text):
        raise KeyError(name)
    return pattern.sub(lambda _: block(name, content), text, count=1)
