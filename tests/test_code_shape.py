"""The shape of the code is a check, not a hope: layering, lint and types run with the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: install bmoe with its [test] extra")
    return str(path)


def test_layers_hold_domain_imports_nothing_outward() -> None:
    proc = _run(_tool("lint-imports"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_finds_nothing() -> None:
    proc = _run(sys.executable, "-m", "ruff", "check", "src", "tests", "tools")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_domain_and_ports_type_check_strictly() -> None:
    proc = _run(sys.executable, "-m", "mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr


MAX_LINES = 900  # the design card: no file over ~900 lines
SOURCE_SUFFIXES = {".py", ".pyx", ".pxd", ".pxi"}


def test_no_source_file_is_longer_than_the_design_allows() -> None:
    """One module, one idea: the C engine included (its rooms, ``cext/stream/*.pxi``)."""
    long = {
        str(path.relative_to(ROOT)): n
        for folder in ("src", "tests", "tools")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in SOURCE_SUFFIXES and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines: {long}"
