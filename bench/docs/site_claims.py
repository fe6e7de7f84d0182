"""The claims page of the site: per claim its verdict, our numbers, how they are computed and, per
case, the value, where it falls against the claim's band and the rows it comes from (bench/docs/claims.py
computes all of it from the committed rows)."""
from __future__ import annotations

from html import escape

from . import claims


def source_html(s: claims.Source) -> str:
    where = " ".join(p for p in (s.direction, s.dtype, s.shape) if p)
    return f"<code>{escape(s.label)}</code> {escape(where)}: {escape(s.value)}"


def part_html(part: claims.Part) -> str:
    judged = (f"band {escape(part.band.text(part.unit))}; verdict: <b>{escape(str(part.verdict))}</b>"
              + (f" ({escape(part.verdict.detail)})" if part.verdict.detail else "")
              if part.band else "context: shown, not judged")
    head = f"<h3>{escape(part.name)}</h3><p class=\"meta\">{judged}</p>"
    if not part.evidence:
        return head + '<p class="none">not measured in the committed results</p>'
    out = ["<table><tr><th>case</th><th>value</th>" + ("<th>against the band</th>" if part.band else "")
           + "<th>from the rows (label, direction, dtype, shape: value)</th></tr>"]
    for e in part.evidence:
        place = f"<td>{part.band.place(e.value)}</td>" if part.band else ""
        rows = "<br>".join(source_html(s) for s in e.sources)
        out.append(f"<tr><td>{escape(e.name)}</td><td>{escape(claims.number(e.value, part.unit))}</td>{place}"
                   f'<td class="rows">{rows}</td></tr>')
    return head + "".join(out) + "</table>"


def claim_html(c: claims.Claim) -> str:
    v = c.verdict
    kind = {claims.HOLDS: "holds", claims.FAILS: "fails", claims.DEPENDS: "depends"}.get(v.word, "unmeasured")
    # one judged part: its verdict's detail is on its own line below; several: say how they combine
    detail = f"<p>{escape(v.detail)}</p>" if len(c.judged) > 1 and v.word != claims.UNMEASURED else ""
    notes = "".join(f"<li>{escape(n)}</li>" for n in c.notes)
    return (f'<section class="claim" id="claim-{c.number}"><h2>{c.number}. {escape(c.text)}</h2>'
            f'<p class="verdict {kind}">{escape(str(v))}</p>{detail}'
            f"<p><b>Our number:</b> {escape(c.our_number())}</p><p class=\"meta\">{escape(c.how)}</p>"
            + "".join(part_html(p) for p in c.parts) + (f'<ul class="notes">{notes}</ul>' if notes else "")
            + "</section>")


def body(rows: list[dict], source: str) -> str:
    """Everything below the page's title and navigation."""
    found = claims.claims(rows)
    index = "".join(f'<li><a href="#claim-{c.number}">{escape(c.text)}</a>: {escape(str(c.verdict))}</li>'
                    for c in found)
    return (f"<p>Claims common in Triton teaching material, checked against {escape(source)}. Every number "
            f"here is computed from those rows when the site is built. A claim's band is the range of values "
            f"it asserts (a \"~\" widens it by {claims.SLACK:.0%} at each end); a part <b>holds</b> when every "
            f"case falls in its band, <b>does not hold</b> when none does, and <b>depends</b> otherwise, on the "
            f"case attribute that splits them when one does. \"Best\" is the highest throughput among a "
            f"backend's steps at that case.</p><ol class=\"claims\">{index}</ol>"
            + "".join(claim_html(c) for c in found))
