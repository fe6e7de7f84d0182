"""The static site (`make site`) built from the committed results: every step has its section, the
pages are well-formed HTML whose relative links resolve, and headless Chromium renders every page
with both ladders and saves a screenshot (skipped only with ROSETTA_NO_BROWSER=1)."""
from __future__ import annotations

import html
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

import rosetta
from rosetta.bench.docs import site, site_data, site_step
from rosetta.bench.docs.report import reference_results

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "source", "wbr"}


class Page(HTMLParser):
    """Collects ids and link targets, and checks that every non-void tag is closed in order."""

    def __init__(self):
        super().__init__()
        self.stack, self.ids, self.links, self.errors = [], set(), [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text())
    p.close()
    return p


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if reference_results() is None:
        pytest.skip("no committed results/*/bench.csv to build the site from")
    out = tmp_path_factory.mktemp("site")
    pages = site.build(out)
    return out, pages


def test_every_page_is_written(built):
    out, pages = built
    assert {p.name for p in pages} == {"index.html", *(f"{op}.html" for op in rosetta.ops_with_steps())}


def test_pages_are_well_formed_and_links_resolve(built):
    out, pages = built
    parsed = {p.name: parse(p) for p in pages}
    for name, page in parsed.items():
        assert not page.errors, f"{name}: {page.errors[:5]}"
        assert not page.stack, f"{name}: unclosed {page.stack[-5:]}"
        for target in page.links:
            url = urlparse(target)
            assert not url.scheme and not url.netloc, f"{name}: network or absolute link {target}"
            file = name if not url.path else unquote(url.path)
            assert (out / file).is_file(), f"{name}: {target} does not resolve to a file"
            if url.fragment:
                assert url.fragment in parsed[file].ids, f"{name}: {target}: no id {url.fragment!r}"


def test_every_variant_has_a_section_with_source_and_header(built):
    out, _ = built
    for op in rosetta.ops_with_steps():
        text = (out / f"{op}.html").read_text()
        ids = parse(out / f"{op}.html").ids
        for v in rosetta.variants(op):
            anchor = site_step.anchor(v)
            assert anchor in ids, f"{v.label}: no section"
            section = text[text.index(f'id="{anchor}"'):]
            section = section[:section.index("</section>")]
            assert html.escape(v.header.title) in section, v.label
            for field in (v.header.changed, v.header.why, v.header.still, v.header.limits):
                assert html.escape(field) in section, f"{v.label}: header field missing"
            assert html.escape(v.source) in section and 'class="highlight"' in section, f"{v.label}: no source"
            # the source's identifiers survive highlighting (tags split tokens, not names)
            assert v.name.split("_")[0] in section
            has_diff = 'class="diff"' in section
            assert has_diff == (v.step > 1), f"{v.label}: diff expected iff step >= 2"
            if v.step > 1:
                prev = rosetta.variants(op, v.backend)[v.step - 2]
                assert html.escape(prev.source) in section, f"{v.label}: diff not against {prev.label}"


def test_index_lists_every_op_and_best_steps(built):
    out, _ = built
    text = (out / "index.html").read_text()
    for op in rosetta.ops_with_steps():
        assert f'href="{op}.html"' in text, op
        assert f'href="{op}.html#cuda-' in text or f'href="{op}.html#triton-' in text, f"{op}: no best step"


def test_plots_are_copied_and_linked(built):
    out, _ = built
    folder = reference_results()
    for op in rosetta.ops_with_steps():
        pngs = sorted(p.name for p in (folder / "plots").glob(f"{op}_*.png"))
        text = (out / f"{op}.html").read_text()
        for name in pngs:
            assert f'src="plots/{name}"' in text and (out / "plots" / name).is_file(), name


def test_mirror_parsing_and_alignment():
    assert site_data.mirror_ranges("CUDA steps 03-08 (fp32, CUDA cores) and 09-11 (16-bit, tensor cores)") \
        == [[3, 4, 5, 6, 7, 8], [9, 10, 11]]
    # numbers inside parentheses are commentary, not steps
    assert site_data.mirror_ranges("CUDA step 5 (block per row, 1 read + 1 write)") == [[5]]
    assert site_data.mirror_ranges("CUDA steps 11 (wgmma + TMA) and 13 (persistent)") == [[11], [13]]
    assert site_data.mirror_ranges("") == []
    for op in rosetta.ops_with_steps():
        rows = site_data.align(op)
        for backend, i in (("cuda", 0), ("triton", 1)):
            placed = [r[i] for r in rows if r[i] is not None]
            assert placed == rosetta.variants(op, backend), f"{op}/{backend}: ladder order or steps lost"
        for cuda, triton in rows:  # a Triton step beside a CUDA step mirrors it
            if cuda and triton and triton.header.mirrors:
                assert cuda.step in site_data.mirrored(triton), (cuda.label, triton.label)


def test_translation_sums_mirrored_nloc():
    for op in rosetta.ops_with_steps():
        for e in site_data.translation([], op):
            assert [v.step for v in e["cuda"]] == [n for n in site_data.mirrored(e["triton"])
                                                   if n <= len(rosetta.variants(op, "cuda"))]
            assert e["cuda_nloc"] == sum(site_data.nloc(v).device_nloc for v in e["cuda"])


def _browser():
    """Chromium's path; skips the test where ROSETTA_NO_BROWSER=1, fails it where none is installed."""
    if os.environ.get("ROSETTA_NO_BROWSER") == "1":
        pytest.skip("ROSETTA_NO_BROWSER=1: the headless-browser check is switched off")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("no chromium on PATH: `make setup` installs Debian's chromium; set ROSETTA_NO_BROWSER=1 to skip")
    return browser


class Rendered(Page):
    """Page, plus each step section's backend, id and ladder column (0 = left, 1 = right) and the
    ladder table's column headings."""

    def __init__(self):
        super().__init__()
        self.tables, self.col, self.heads, self.steps, self._th = [], -1, [], [], None

    def handle_starttag(self, tag, attrs):
        super().handle_starttag(tag, attrs)
        classes = (dict(attrs).get("class") or "").split()
        in_ladder = bool(self.tables) and self.tables[-1]
        if tag == "table":
            self.tables.append("ladder" in classes)
        elif tag == "tr" and in_ladder:
            self.col = -1
        elif tag == "td" and in_ladder:  # a step alone in its row spans both columns: column 2
            self.col = 2 if dict(attrs).get("colspan") == "2" else self.col + 1
        elif tag == "th" and in_ladder:
            self._th = ""
        elif tag == "section" and "step" in classes and any(self.tables):
            self.steps.append((classes[-1], dict(attrs).get("id"), self.col))

    def handle_endtag(self, tag):
        super().handle_endtag(tag)
        if tag == "table" and self.tables:
            self.tables.pop()
        elif tag == "th" and self._th is not None:
            self.heads.append(self._th.strip())
            self._th = None

    def handle_data(self, data):
        if self._th is not None:
            self._th += data


def _chromium(browser, profile, *args):
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                          *args], capture_output=True, text=True, timeout=60)
    return run.stdout, run.stderr[-2000:]


def test_browser_renders_step_titles(built, tmp_path):
    """Chromium loads every page: the DOM it builds has every step title, an op page has the CUDA
    ladder in the left column and the Triton ladder in the right, its links are the ones
    test_pages_are_well_formed_and_links_resolve resolved, and a 1400x1000 screenshot is not blank."""
    browser = _browser()
    out, pages = built
    ops = rosetta.ops_with_steps()
    for path in pages:
        name, uri = path.name, path.resolve().as_uri()
        dom, err = _chromium(browser, tmp_path / "profile", "--dump-dom", uri)
        assert "</html>" in dom, f"{name}: no DOM dumped: {err}"
        rendered = Rendered()
        rendered.feed(dom)
        rendered.close()
        # the browser's DOM links to what the page's source links to, every target of which resolves
        assert set(rendered.links) == set(parse(path).links), f"{name}: rendered links differ from the source's"
        op = path.stem
        titles = ops if op == "index" else [v.header.title for v in rosetta.variants(op)]
        for title in titles:
            assert html.escape(title, quote=False) in dom, f"{name}: {title!r} not rendered"
        if op != "index":
            assert rendered.heads[:2] == ["CUDA", "Triton"], f"{name}: ladder headings {rendered.heads[:2]}"
            alone = {v.label for row in site_data.align(op) if None in row for v in row if v}
            for col, backend in enumerate(("cuda", "triton")):
                placed = [(i, c) for b, i, c in rendered.steps if b == backend]
                want = [(site_step.anchor(v), 2 if v.label in alone else col) for v in rosetta.variants(op, backend)]
                assert placed == want, f"{name}: the {backend} ladder is not rendered whole in column {col}"
        shot = tmp_path / f"{op}.png"
        _, err = _chromium(browser, tmp_path / "profile", "--hide-scrollbars", "--window-size=1400,1000",
                           f"--screenshot={shot}", uri)
        assert shot.is_file(), f"{name}: no screenshot: {err}"
        assert shot.stat().st_size > 10_000, f"{name}: screenshot of {shot.stat().st_size} bytes (blank page?)"


OVERFLOW_PROBE = ('<script>document.body.setAttribute("data-overflow", String('
                  'document.documentElement.scrollWidth > document.documentElement.clientWidth));</script>')


def test_every_page_fits_a_1366_px_window(built, tmp_path):
    """No page scrolls sideways in a 1,366 px window (a common laptop width): wide tables scroll
    inside their own box. Measured by Chromium on a copy of each page with a probe script."""
    browser = _browser()
    out, pages = built
    for path in [*pages, out / "claims.html"]:
        probe = path.with_name(f"_probe_{path.name}")
        probe.write_text(path.read_text().replace("</body>", OVERFLOW_PROBE + "</body>"))
        dom, err = _chromium(browser, tmp_path / "profile", "--window-size=1366,900", "--dump-dom", probe.resolve().as_uri())
        probe.unlink()
        assert 'data-overflow="false"' in dom, f"{path.name} is wider than a 1,366 px window ({err or 'overflow'})"
