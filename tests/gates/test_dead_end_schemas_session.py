"""The pathological schemas of ``test_dead_end_schemas`` through the two routes that are not
HTTP: a library user's ``Session.chat`` (``response_format`` and ``tools``) and the session
line protocol (``json_schema``). Each is refused with a short message about the schema or
answered; the session lives on, and the greedy request after each gives the tokens a fresh
session gives."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dead_end_schemas import DUMP, PATHOLOGICAL, QWEN3

from bmoe.adapters.llama import ContextParams
from bmoe.errors import BmoeError
from bmoe.runtime import Session, SessionConfig

TinyModelPath = Callable[..., Path]
PARAMS = ContextParams(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
GREEDY = [{"role": "user", "content": "Hi"}]


def greedy(s: Session) -> str:
    return s.chat(GREEDY, temperature=0.0, max_tokens=12).text


@pytest.fixture(scope="module")
def session(tiny_model_path: TinyModelPath) -> Iterator[Session]:
    config = SessionConfig(
        model_path=tiny_model_path("qwen3moe"), context=PARAMS, chat=True, chat_template=QWEN3.read_text()
    )
    with Session.open(config) as s:
        yield s


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_session_chat_refuses_or_answers_and_the_next_greedy_turn_is_a_fresh_sessions(
    session: Session, tiny_model_path: TinyModelPath, name: str, where: str
) -> None:
    schema = PATHOLOGICAL[name]
    fields: dict[str, Any] = {"max_tokens": 24}
    if where == "response_format":
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    else:
        fields["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        fields["tool_choice"] = "required"
    want = greedy(session)
    try:
        session.chat(GREEDY, **fields)
    except BmoeError as refused:
        message = str(refused)
        assert len(message) < 400 and not any(word in message for word in DUMP), message
    assert session.engine.failed is None
    assert greedy(session) == want


def test_the_session_protocol_refuses_a_dead_end_schema_and_serves_the_next_line(
    tiny_model_path: TinyModelPath,
) -> None:
    lines = [{"cmd": "generate", "id": 0, "prompt": "Hi", "n_predict": 8, "clear_kv": True}]
    for i, schema in enumerate(PATHOLOGICAL.values(), start=1):
        lines.append({"cmd": "generate", "id": i, "prompt": "Hi", "n_predict": 8, "json_schema": schema})
    lines.append({"cmd": "generate", "id": 99, "prompt": "Hi", "n_predict": 8, "clear_kv": True})
    model = str(tiny_model_path("qwen3moe"))
    command = [sys.executable, "-m", "bmoe.cli", "-m", model, "--session", "-c", "1024", "-t", "2"]
    done = subprocess.run(
        command,
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = {}
    for raw in done.stdout.splitlines():  # BMOE_<KIND> {json}
        kind, _, payload = raw.partition(" ")
        try:
            answer = json.loads(payload)
        except ValueError:
            continue
        if isinstance(answer, dict) and "id" in answer:
            answers.setdefault(answer["id"], []).append(answer | {"kind": kind})
    for i in range(1, len(PATHOLOGICAL) + 1):
        for answer in answers[i]:
            assert not answer.get("fatal"), answer
            text = json.dumps(answer)
            assert not any(word in text for word in DUMP), text

    def done_text(i: int) -> str:
        return str(next(a for a in answers[i] if a["kind"] == "BMOE_DONE")["text"])

    assert done_text(99) == done_text(0)
    refused = [
        i for i in range(1, len(PATHOLOGICAL) + 1) if any(a["kind"] == "BMOE_ERROR" for a in answers[i])
    ]
    assert refused, answers  # the self reference at least is refused by name
