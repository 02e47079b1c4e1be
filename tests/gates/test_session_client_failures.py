"""``SessionClient`` when the child does not start: killed, reaped, and a clear error that
quotes the child's last stderr lines."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.client import SessionClient, SessionClientError

TinyModel = Callable[[str], Path]


def _fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for the interpreter (the client runs it as
    ``PYTHON -m bmoe.cli --session ARGS``)."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_child_that_never_says_ready_is_killed_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = _fake_python(tmp_path, 'echo "loading the model..." >&2\nexec sleep 600')
    spawned: list[SessionClient] = []
    original = SessionClient._kill

    def spy(self: SessionClient) -> None:
        spawned.append(self)
        original(self)

    monkeypatch.setattr(SessionClient, "_kill", spy)
    start = time.monotonic()
    with pytest.raises(SessionClientError, match=r"no response within 1\.5 s(.|\n)*loading the model"):
        SessionClient([], python=python, timeout=1.5)
    assert time.monotonic() - start < 30
    (client,) = spawned
    assert client.process.returncode is not None  # reaped


def test_a_child_that_dies_is_reported_with_its_status_and_stderr(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "first line" >&2\necho "the real reason" >&2\nexit 3')
    with pytest.raises(SessionClientError) as info:
        SessionClient([], python=python, timeout=30)
    msg = str(info.value)
    assert "exit status 3" in msg and "first line\nthe real reason" in msg


def test_a_session_that_cannot_open_its_model_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    with pytest.raises(
        SessionClientError, match=f"the session did not start: model file not found: {missing}"
    ):
        SessionClient(["-m", str(missing)], timeout=60)


def test_a_session_that_dies_later_is_reported_with_its_stderr(tiny_model_path: TinyModel) -> None:
    client = SessionClient(["-m", str(tiny_model_path("qwen3moe"))], timeout=60)
    client.process.kill()
    client.process.wait()
    with pytest.raises(SessionClientError, match=r"the session process ended \(exit status -9\)"):
        client.generate("Hi", n_predict=2)
    client.close()
