"""SIGTERM stops as Ctrl-C does: ``python -m bmoe.serve --cache-disk DIR`` after a
conversation, stopped with SIGTERM or SIGINT, exits 0 having written the prompt cache's
states to ``DIR``; started again on ``DIR``, it answers the conversation's next turn from the
restored state (cached tokens reported) with the tokens a fresh server gives.
``bmoe.cli --session`` likewise, on SIGTERM and at the end of its input.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
TIMEOUT = 120
FIRST = [{"role": "user", "content": "Tell me about the weather in Paris in spring, please."}]


@contextmanager
def server(model: Path, *flags: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m bmoe.serve`` on a free port, and its API's base URL."""
    args = [sys.executable, "-m", "bmoe.serve", "-m", str(model), "-c", "1024", "--port", "0"]
    args += ["--chat-template-file", str(QWEN3), "--max-tokens", "8", *flags]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            found = re.search(r"serving '.*' on (http://\S+)/v1", line)
            if found:
                yield proc, found.group(1)
                break
        else:
            raise AssertionError(f"the server did not start (exit {proc.wait(TIMEOUT)})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)


def chat(base: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "temperature": 0.0, "logprobs": True}
    answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def tokens(answer: dict[str, Any]) -> list[str]:
    return [t["token"] for t in answer["choices"][0]["logprobs"]["content"]]


def second_turn(first: dict[str, Any]) -> list[dict[str, Any]]:
    reply = first["choices"][0]["message"]["content"] or ""
    return [*FIRST, {"role": "assistant", "content": reply}, {"role": "user", "content": "And in autumn?"}]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_server_keeps_the_conversation_on_disk(
    tiny_model_path: TinyModelPath, tmp_path: Path, sig: signal.Signals
) -> None:
    model = tiny_model_path("qwen3moe")
    disk = tmp_path / "cache"
    kept = ("--cache-disk", str(disk), "--cache-ram", "64")
    with server(model, *kept) as (proc, base):
        first = chat(base, FIRST)
        proc.send_signal(sig)
        assert proc.wait(TIMEOUT) == 0
    assert any(disk.iterdir()), "no state was written to --cache-disk"
    with server(model) as (_, base):
        fresh = chat(base, second_turn(first))
    with server(model, *kept) as (proc, base):
        again = chat(base, second_turn(first))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # restored, not prefilled
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert tokens(again) == tokens(fresh)


def _session(model: Path, disk: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "bmoe.cli", "--session", "-m", str(model), "-c", "512", "--chatml"]
    args += ["--cache-disk", str(disk), "--cache-ram", "64"]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _lines(proc: subprocess.Popen[bytes], n: int) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    return [json.loads(proc.stdout.readline().split(b" ", 1)[1]) for _ in range(n)]


GENERATE = {"cmd": "generate", "id": 1, "prompt": "Hello there, how are you?", "n_predict": 6}


@pytest.mark.parametrize("how", ["SIGTERM", "end of input"])
def test_a_stopped_session_process_keeps_its_state_on_disk(
    tiny_model_path: TinyModelPath, tmp_path: Path, how: str
) -> None:
    model = tiny_model_path("qwen3moe")
    disk = tmp_path / "cache"
    proc = _session(model, disk)
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(GENERATE) + "\n").encode())
    proc.stdin.flush()
    ready, done = _lines(proc, 2)
    assert "n_ctx" in ready and done["id"] == 1
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        proc.stdin.close()
    assert proc.wait(TIMEOUT) == 0
    assert any(disk.iterdir()), "no state was written to --cache-disk"
