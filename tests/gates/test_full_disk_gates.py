"""The server on a disk that fails (issue 65's three runs), on the qwen3 fixture streamed
with a 1 MiB cache: ``--cache-disk DIR`` on a full tmpfs, on one that fills and frees itself,
and on a read-only mount.

- ``--cache-ram 0`` (every state goes to the disk tier) on a 64 KiB tmpfs: no request fails
  (before: 200, 500, 200, 500), the answers equal a server's without ``--cache-disk``, and
  the disk's failure is one warning line;
- when space comes back, states are written again without a restart, said in one line;
- ``--cache-ram 64`` then SIGTERM: exit 0 with one warning line (before: a traceback, exit 1);
- a read-only ``DIR``: one warning line at start, then served as without ``--cache-disk``
  (before: a traceback at start).

The mounts need root; where they are not permitted the tests skip, saying so.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from disk_faults import fault_env, read_only, small_tmpfs

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
TIMEOUT = 120
N_REQUESTS = 4
WARNING = "bmoe: warning: cannot write to"


def prompt(i: int) -> list[dict[str, Any]]:
    """A conversation of its own (~400 tokens: its state is ~420 KiB, more than the tmpfs)."""
    return [{"role": "user", "content": f"Conversation {i}: " + "tell me about the weather in Paris. " * 30}]


class Server:
    def __init__(self, proc: subprocess.Popen[str], base: str, lines: list[str]) -> None:
        self.proc, self.base, self.lines = proc, base, lines

    def chat(self, messages: list[dict[str, Any]]) -> tuple[int, list[str]]:
        body = {"model": "m", "messages": messages, "temperature": 0.0, "logprobs": True}
        answer = httpx.post(f"{self.base}/v1/chat/completions", json=body, timeout=TIMEOUT)
        if answer.status_code != 200:
            return answer.status_code, [answer.text]
        return 200, [t["token"] for t in answer.json()["choices"][0]["logprobs"]["content"]]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(TIMEOUT)

    def said(self, text: str) -> list[str]:
        return [line for line in list(self.lines) if text in line]


@contextmanager
def server(model: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    args = [sys.executable, "-m", "bmoe.serve", "-m", str(model), "-c", "2048", "--port", "0"]
    args += [
        "--chat-template-file",
        str(QWEN3),
        "--max-tokens",
        "8",
        "--moe-stream",
        "--cache-mb",
        "1",
        *flags,
    ]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    started = threading.Event()
    found: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if not found and (m := re.search(r"serving '.*' on (http://\S+)/v1", line)):
                found.append(m.group(1))
                started.set()
        started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        started.wait(TIMEOUT)
        assert found, "the server did not start:\n" + "\n".join(lines[-30:])
        yield Server(proc, found[0], lines)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)
        reader.join(TIMEOUT)


@pytest.fixture(scope="module")
def fresh_answers(tiny_model_path: TinyModelPath) -> list[list[str]]:
    """What a server without ``--cache-disk`` answers."""
    with server(tiny_model_path("qwen3moe"), "--cache-ram", "0") as s:
        answers = [s.chat(prompt(i)) for i in range(N_REQUESTS + 1)]
        assert s.stop() == 0
    assert all(code == 200 for code, _ in answers), answers
    return [tokens for _, tokens in answers]


def test_a_full_disk_tier_fails_no_request(
    tiny_model_path: TinyModelPath, tmp_path: Path, fresh_answers: list[list[str]]
) -> None:
    with (
        small_tmpfs(tmp_path / "full", "64k") as disk,
        server(tiny_model_path("qwen3moe"), "--cache-disk", str(disk), "--cache-ram", "0") as s,
    ):
        answers = [s.chat(prompt(i)) for i in range(N_REQUESTS)]
        assert s.stop() == 0
        assert [code for code, _ in answers] == [200] * N_REQUESTS, answers
        assert [tokens for _, tokens in answers] == fresh_answers[:N_REQUESTS]
        warnings = s.said(WARNING)
        assert len(warnings) == 1, s.lines
        assert str(disk) in warnings[0] and "ENOSPC" in warnings[0] and "not kept" in warnings[0]
        assert not s.said("Traceback"), s.lines


def _fill(disk: Path) -> Path:
    """A file that takes every free byte of ``disk``."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def test_states_are_written_again_once_space_comes_back(
    tiny_model_path: TinyModelPath, tmp_path: Path, fresh_answers: list[list[str]]
) -> None:
    with (
        small_tmpfs(tmp_path / "fills", "2m") as disk,
        server(tiny_model_path("qwen3moe"), "--cache-disk", str(disk), "--cache-ram", "0") as s,
    ):
        filler = _fill(disk)
        first = [s.chat(prompt(i)) for i in range(2)]
        assert [code for code, _ in first] == [200, 200], first
        assert len(s.said(WARNING)) == 1, s.lines
        filler.unlink()  # space comes back
        states: list[Path] = []
        for attempt in range(30):  # the back-off's wait passes: the next state is written
            time.sleep(1)
            code, tokens = s.chat(prompt(2 + attempt % (N_REQUESTS - 1)))
            assert code == 200, tokens
            states = list(disk.rglob("*.state"))
            if states:
                break
        assert states, "no state written after space came back:\n" + "\n".join(s.lines[-20:])
        assert s.stop() == 0
        assert len(s.said("work again")) == 1, s.lines
        assert len(s.said(WARNING)) == 1, s.lines


def test_a_stop_whose_states_cannot_be_written_exits_0_with_one_warning(
    tiny_model_path: TinyModelPath, tmp_path: Path
) -> None:
    with (
        small_tmpfs(tmp_path / "full", "64k") as disk,
        server(tiny_model_path("qwen3moe"), "--cache-disk", str(disk), "--cache-ram", "64") as s,
    ):
        answers = [s.chat(prompt(i)) for i in range(3)]
        assert [code for code, _ in answers] == [200] * 3, answers
        assert not s.said(WARNING)  # kept in memory so far
        assert s.stop() == 0
        assert len(s.said(WARNING)) == 1, s.lines
        assert not s.said("Traceback"), s.lines


def test_a_read_only_cache_disk_starts_with_one_warning_and_serves(
    tiny_model_path: TinyModelPath, tmp_path: Path, fresh_answers: list[list[str]]
) -> None:
    with (
        read_only(tmp_path / "ro") as disk,
        server(tiny_model_path("qwen3moe"), "--cache-disk", str(disk), "--cache-ram", "0") as s,
    ):
        answers = [s.chat(prompt(i)) for i in range(2)]
        assert s.stop() == 0
        assert [tokens for code, tokens in answers] == fresh_answers[:2], answers
        warnings = s.said("warning")
        assert len(warnings) == 1, s.lines
        assert f"--cache-disk {disk}" in warnings[0] and "EROFS" in warnings[0], warnings
        assert "without the disk tier" in warnings[0]
        assert not s.said("Traceback"), s.lines


def test_a_usage_profile_the_disk_cannot_keep_costs_one_warning_and_no_request(
    tiny_model_path: TinyModelPath, tmp_path: Path, fresh_answers: list[list[str]]
) -> None:
    profiles = tmp_path / "profiles"
    env = fault_env(profiles, "write", errno.ENOSPC)
    env["BMOE_PROFILE_DIR"] = str(profiles)
    with server(tiny_model_path("qwen3moe"), "--cache-ram", "0", "--profile", "auto", env=env) as s:
        answers = [s.chat(prompt(i)) for i in range(2)]
        assert s.stop() == 0
        assert [tokens for _, tokens in answers] == fresh_answers[:2], answers
        warnings = s.said(WARNING)
        assert len(warnings) == 1 and str(profiles) in warnings[0] and "usage profile" in warnings[0], s.lines
        assert not s.said("Traceback"), s.lines
    assert not list(profiles.glob("*.json"))


def test_a_state_file_that_cannot_be_read_is_a_miss_and_the_answer_a_fresh_servers(
    tiny_model_path: TinyModelPath, tmp_path: Path, fresh_answers: list[list[str]]
) -> None:
    disk = tmp_path / "states"
    kept = ("--cache-disk", str(disk), "--cache-ram", "0")
    with server(tiny_model_path("qwen3moe"), *kept) as s:
        assert s.chat(prompt(0)) == (200, fresh_answers[0])
        assert s.stop() == 0
    assert len(list(disk.rglob("*.state"))) == 1
    with server(tiny_model_path("qwen3moe"), *kept, env=fault_env(disk, "read", errno.EIO)) as s:
        assert s.chat(prompt(0)) == (200, fresh_answers[0])  # its state unreadable: prefilled again
        assert s.stop() == 0
        refused = s.said("refused")
        assert len(refused) == 1 and ".state" in refused[0] and "Input/output error" in refused[0], s.lines
