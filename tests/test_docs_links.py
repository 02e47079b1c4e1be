"""Every relative link between the docs lands: the file exists and its ``#anchor`` names a heading.

Covers the links in ``README.md`` and ``docs/*.md`` to a ``.md`` file (``[text](other.md)``,
``[text](other.md#section)``) and to a section of the same page (``[text](#section)``). Anchors
follow GitHub's rule for headings: the heading's text lowercased, every space a ``-``, every
character that is not a letter, a digit, ``-`` or ``_`` dropped, and ``-1``, ``-2``, ... added to
a repeated one; an ``<a id="...">`` or ``<a name="...">`` on the page is an anchor too. Fenced
code blocks and code spans hold no links or headings. No model, no network: a fast check.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Links known to be broken in pages this change could not edit: (page, target) -> why. Each is
# skipped only while it stays broken; once mended it is checked like any other.
KNOWN_BROKEN: dict[tuple[str, str], str] = {}

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)\s*=\s*\"([^\"]+)\"", re.IGNORECASE)
_INLINE_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_HTML_TAG = re.compile(r"<[^>]+>")


def _prose_lines(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1) == fence:
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's markdown text."""
    text = _INLINE_LINK.sub(r"\1", heading)
    text = _HTML_TAG.sub("", text).strip().lower()
    kept = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return kept.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(page):
        found.update(_HTML_ANCHOR.findall(line))
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def _links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of each relative link to a .md page or to an anchor of this one."""
    links: list[tuple[int, str]] = []
    for number, line in _prose_lines(page):
        for target in _LINK.findall(_CODE_SPAN.sub("``", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("/"):
                continue  # a URL (https:, mailto:) or an absolute path: not this test's
            path = target.split("#", 1)[0]
            if path.endswith(".md") or target.startswith("#"):
                links.append((number, target))
    return links


def _broken(page: Path, target: str) -> str | None:
    """Why a link does not resolve, or None when it does."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.is_file():
        return "no such file"
    if anchor and anchor not in anchors(dest):
        return f"no heading in {dest.relative_to(ROOT)} has the anchor #{anchor}"
    return None


def test_the_slug_rule_is_githubs() -> None:
    assert slug("How to reproduce: `python -m bmoe.bench`") == "how-to-reproduce-python--m-bmoebench"
    assert (
        slug("An adaptive stale gate: `--predict-prefetch auto` (2026-12-02)")
        == "an-adaptive-stale-gate---predict-prefetch-auto-2026-12-02"
    )
    assert slug("The stale gate's lead, measured") == "the-stale-gates-lead-measured"
    assert slug("See [the log](benchmarks-log.md) *now*") == "see-the-log-now"
    assert slug("snake_case_kept") == "snake_case_kept"


def test_repeated_headings_are_numbered_and_code_blocks_hold_none(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('# A\n\n## A\n\n```sh\n# not a heading\n```\n\n<a id="kept-anchor"></a>\n')
    assert anchors(page) == {"a", "a-1", "kept-anchor"}


def _cases() -> list[tuple[str, int, str]]:
    return [
        (str(page.relative_to(ROOT)), number, target) for page in PAGES for number, target in _links(page)
    ]


CASES = _cases()


def test_the_pages_have_links_to_check() -> None:
    assert len(CASES) > 50, "the link pattern finds almost nothing: it is broken, not the docs"


@pytest.mark.parametrize(("page", "line", "target"), CASES, ids=[f"{p}:{n}:{t}" for p, n, t in CASES])
def test_relative_link_resolves(page: str, line: int, target: str) -> None:
    why = _broken(ROOT / page, target)
    if why is not None and (page, target) in KNOWN_BROKEN:
        pytest.skip(f"{page}:{line} -> {target}: {KNOWN_BROKEN[(page, target)]}")
    assert why is None, f"{page}:{line}: the link to {target} does not resolve: {why}"
