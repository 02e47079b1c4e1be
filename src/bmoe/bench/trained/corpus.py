"""Training text found on the machine: the docstrings of the running Python's standard
library, and the plain-text package documentation under ``/usr/share/doc``.

Docstrings rather than whole sources: the tokenizer learned its few merges from English
and has none for runs of spaces, so Python's indentation would make a third of the tokens
lone spaces, whose routing is trivially predictable.

Only ASCII files are taken (the tokenizer's Python reference is exact on ASCII, so the ids
trained on are the ids llama.cpp's tokenizer gives the same text), documentation files
whose content repeats are taken once, and each file goes whole to one split, chosen by a
hash of its path: what the figures are computed on was never trained on. The selection is
deterministic for a given machine; the caps bound the size on a machine with lots of text.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

DOC_ROOT = Path("/usr/share/doc")
HELD_OUT_EVERY = 10
"""One file in ``HELD_OUT_EVERY`` (by path hash) is held out."""
TRAIN_CAP = 8_000_000
HELD_OUT_CAP = 400_000
MAX_FILE_BYTES = 256_000
MIN_FILE_BYTES = 512


@attrs.frozen
class Source:
    """One file of text."""

    path: Path
    text: str

    @property
    def held_out(self) -> bool:
        return zlib.crc32(str(self.path).encode("utf-8")) % HELD_OUT_EVERY == 0


@attrs.frozen
class Corpus:
    train: str
    held_out: str
    n_train_files: int
    n_held_out_files: int
    roots: tuple[str, ...]

    def text(self) -> str:
        return (
            f"corpus: {len(self.train):,} bytes of training text from {self.n_train_files} files, "
            f"{len(self.held_out):,} bytes held out from {self.n_held_out_files} files "
            f"(under {', '.join(self.roots)})"
        )


def _ascii_text(path: Path) -> str | None:
    try:
        if not MIN_FILE_BYTES <= path.stat().st_size <= MAX_FILE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        return None


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstrings(source: str) -> str:
    """Every docstring of a module (its own, its classes' and functions'), dedented, in order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    found = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, _DOCUMENTED))
    return "\n\n".join(doc for doc in found if doc)


def stdlib_sources(root: Path | None = None) -> Iterator[Source]:
    """The docstrings of each top-level ``*.py`` module of the standard library, by name."""
    folder = root or Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(folder.glob("*.py")):
        source = _ascii_text(path)
        text = docstrings(source) if source is not None else ""
        if len(text) >= MIN_FILE_BYTES:
            yield Source(path, text)


def doc_sources(root: Path = DOC_ROOT) -> Iterator[Source]:
    """Plain ASCII files under ``root`` (not compressed, not HTML), each content once."""
    seen: set[bytes] = set()
    if not root.is_dir():
        return
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.suffix in {".gz", ".xz", ".bz2", ".html", ".htm", ".png", ".svg", ".pdf"}:
            continue
        text = _ascii_text(path)
        if text is None:
            continue
        digest = hashlib.sha256(text.encode("ascii")).digest()
        if digest not in seen:
            seen.add(digest)
            yield Source(path, text)


def build_corpus(
    sources: Iterable[Source],
    roots: Iterable[str],
    *,
    train_cap: int = TRAIN_CAP,
    held_out_cap: int = HELD_OUT_CAP,
) -> Corpus:
    """Split ``sources`` by path hash, taking files in order until each split's cap."""
    train: list[str] = []
    held: list[str] = []
    sizes = [0, 0]
    for source in sources:
        side, cap, index = (held, held_out_cap, 1) if source.held_out else (train, train_cap, 0)
        if sizes[index] + len(source.text) > cap:
            continue
        side.append(source.text)
        sizes[index] += len(source.text)
    return Corpus(
        train="\n".join(train),
        held_out="\n".join(held),
        n_train_files=len(train),
        n_held_out_files=len(held),
        roots=tuple(roots),
    )


def _interleave(*streams: Iterable[Source]) -> Iterator[Source]:
    iterators = [iter(s) for s in streams]
    while iterators:
        for it in list(iterators):
            item = next(it, None)
            if item is None:
                iterators.remove(it)
            else:
                yield item


def machine_corpus() -> Corpus:
    """The corpus of this machine: standard library docstrings and documentation files taken
    in turn."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    roots = [str(stdlib)] + ([str(DOC_ROOT)] if DOC_ROOT.is_dir() else [])
    corpus = build_corpus(_interleave(stdlib_sources(stdlib), doc_sources()), roots)
    if not corpus.train or not corpus.held_out:
        raise RuntimeError(f"too little ASCII text found under {', '.join(roots)} to train on")
    return corpus
