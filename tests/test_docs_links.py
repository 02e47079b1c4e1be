"""Every relative link between the docs lands, and every repository path they name exists.

Links: those in ``README.md``, ``docs/*.md`` and ``tools/README.md`` to another file
(``[text](other.md)``, ``[text](other.md#section)``, ``[text](../tools/README.md)``) and to a
section of the same page (``[text](#section)``). Anchors follow GitHub's rule for headings:
the heading's text lowercased, every space a ``-``, every character that is not a letter, a
digit, ``-`` or ``_`` dropped, and ``-1``, ``-2``, ... added to a repeated one; an ``<a
id="...">`` or ``<a name="...">`` on the page is an anchor too. Fenced code blocks and code
spans hold no links or headings.

Paths: every path from the repository's root that a page names, in its prose, its code spans
or its commands (``tools/replay_eviction.py``, ``src/bmoe/cext/stream/*.pxi``,
``tests/gates/``), exists in the checkout (a pattern: matches at least one file). The folders
that moved away (``scripts/``, the top-level ``bench/``) are looked for too, so a page that
still names them fails. No model, no network: a fast check.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tools" / "README.md"]

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
    """(line, target) of each relative link: to a file or folder of the checkout, or to an
    anchor of this page."""
    links: list[tuple[int, str]] = []
    for number, line in _prose_lines(page):
        for target in _LINK.findall(_CODE_SPAN.sub("``", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("/"):
                continue  # a URL (https:, mailto:) or an absolute path: not this test's
            links.append((number, target))
    return links


def _broken(page: Path, target: str) -> str | None:
    """Why a link does not resolve, or None when it does."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return "no such file or folder"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
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


# A path from the repository's root: one of its top folders (and the two that moved away,
# so that a page still naming them fails), then the rest of the path; not part of a longer
# path (``~/.cache/bmoe/bench/...``, ``/tmp/bench/...``) nor of a dotted name.
_TOP_FOLDERS = ("src", "tests", "tools", "docs", ".ci", "scripts", "bench")
_TOP = "|".join(re.escape(folder) for folder in _TOP_FOLDERS)
_REPO_PATH = re.compile(rf"(?<![\w./~$-])((?:{_TOP})/[\w./*-]*)")


# Paths the docs name in another project's tree, by prefix -> whose.
ELSEWHERE = {"src/models/": "llama.cpp's source (its per-architecture graphs), not bmoe's"}


def _repo_paths(page: Path) -> list[tuple[int, str]]:
    """(line, path) of each repository path the page names, code blocks included."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        for path in _REPO_PATH.findall(line):
            path = path.rstrip(".-")
            if path.rstrip("/") in _TOP_FOLDERS:  # ``bench/``: the cache's folder of that name
                continue
            if not any(path.startswith(prefix) for prefix in ELSEWHERE):
                found.append((number, path))
    return found


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path.rstrip("/")))
    return (ROOT / path).exists()


PATH_CASES = [(str(page.relative_to(ROOT)), n, path) for page in PAGES for n, path in _repo_paths(page)]


def test_the_pages_name_paths_to_check() -> None:
    assert len(PATH_CASES) > 50, "the path pattern finds almost nothing: it is broken, not the docs"
    assert _repo_paths(ROOT / "tools" / "README.md"), "tools/README.md names no path"


def test_the_path_pattern_skips_paths_outside_the_checkout(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "`~/.cache/bmoe/bench/m.gguf`, /tmp/bench/x, `bench/` under the cache root, bmoe.tools/x,\n"
        "```sh\npython tools/replay_eviction.py --x\n```\nsee src/bmoe/cext/stream/*.pxi.\n",
        encoding="utf-8",
    )
    assert _repo_paths(page) == [(3, "tools/replay_eviction.py"), (5, "src/bmoe/cext/stream/*.pxi")]


@pytest.mark.parametrize(("page", "line", "path"), PATH_CASES, ids=[f"{p}:{n}:{t}" for p, n, t in PATH_CASES])
def test_a_repo_path_named_in_the_docs_exists(page: str, line: int, path: str) -> None:
    assert _exists(path), f"{page}:{line} names {path}, which is not in the checkout"
