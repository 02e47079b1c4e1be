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
    proc = _run(sys.executable, "-m", "ruff", "check", "src", "tests", "scripts")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_domain_and_ports_type_check_strictly() -> None:
    proc = _run(sys.executable, "-m", "mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
