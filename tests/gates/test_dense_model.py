"""A model without routed experts (the generated ``llama-dense``) asked to stream: it runs
resident, with one line saying why, and computes exactly what it computes resident, in every
mode: one-shot CLI, ``Session``, the ``--session`` protocol and decisions (``--decide``).

``llama`` is in the expert registry (Mixtral files are ``llama`` with experts), so this is
the case a registry keyed on the architecture alone would get wrong.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.adapters.protocol import DecideDone
from bmoe.client import SessionClient
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.moe_arch import ARCHS
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures import DENSE_FIXTURES, FIXTURES

NAME = "llama-dense"
NOTE = "moe-stream: llama model has no routed experts; running resident"
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
PROMPT = "The quick brown fox jumps over the lazy dog"

TinyModel = Callable[[str], Path]


@pytest.fixture(scope="module")
def dense(tiny_model_path: TinyModel) -> Path:
    return tiny_model_path(NAME)


def moe_stream_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "moe-stream" in line]


def test_the_dense_fixture_is_a_llama_without_experts() -> None:
    spec = DENSE_FIXTURES[NAME]
    assert spec.arch == "llama" and spec.arch in ARCHS
    assert spec.dims.n_expert == 0 and NAME not in FIXTURES


def test_a_session_asked_to_stream_runs_resident_with_one_note_and_the_same_output(dense: Path) -> None:
    request = GenerateRequest(PROMPT, n_predict=8)
    with Session.open(SessionConfig(model_path=dense, context=PARAMS)) as s:
        resident = s.generate(request)
        resident_logits = s.last_logits()
        assert s.notes == []
    config = SessionConfig(model_path=dense, context=PARAMS, stream=StreamConfig(enabled=True))
    with Session.open(config) as s:
        assert s.streaming is None
        assert s.notes == [NOTE]
        assert (s.arch, s.n_expert) == ("llama", 0)
        asked = s.generate(request)
        assert asked.stream is None
        assert asked.tokens == resident.tokens and len(asked.tokens) == 8
        assert np.array_equal(s.last_logits(), resident_logits)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bmoe.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_one_shot_cli_with_moe_stream_prints_the_resident_answer_and_one_note(dense: Path) -> None:
    common = ["-m", str(dense), "-p", PROMPT, "-n", "4", "-c", "256"]
    resident = _cli(*common)
    asked = _cli(*common, "--moe-stream")
    assert resident.returncode == 0 and asked.returncode == 0, asked.stderr
    assert asked.stdout == resident.stdout and asked.stdout.strip()
    assert moe_stream_lines(asked.stderr) == [f"bmoe: {NOTE}"]
    assert moe_stream_lines(resident.stderr) == []
    assert "mode: resident" in asked.stderr


def _client(dense: Path, *extra: str) -> SessionClient:
    args = ["-m", str(dense), "-c", "256", "-n", "4", "--moe-stream", *extra]
    return SessionClient(args)


def _stderr(client: SessionClient) -> str:
    return "\n".join(client.stderr_tail)


def test_the_session_protocol_with_moe_stream_is_ready_and_generates(dense: Path) -> None:
    with Session.open(SessionConfig(model_path=dense, context=PARAMS)) as s:
        expected = s.generate(GenerateRequest(PROMPT, n_predict=4)).text
    client = _client(dense)
    with client:
        assert (client.ready.arch, client.ready.n_expert_used) == ("llama", 0)
        done = client.generate(PROMPT)
        again = client.generate(PROMPT)
    assert done.tokens == 4 and done.text == expected and again.text == expected
    assert moe_stream_lines(_stderr(client)) == [f"bmoe: {NOTE}"]


def test_decisions_with_moe_stream_run_resident_and_score_as_resident(dense: Path) -> None:
    choices = ["yes", "no", "maybe"]
    outcomes = []
    for extra in ((), ("--moe-stream",)):
        args = ["-m", str(dense), "-c", "256", "--decide", *extra]
        client = SessionClient(args, stderr=subprocess.PIPE)
        with client:
            outcomes.append(client.decide("Is the sky blue? Answer:", "", choices))
        notes = moe_stream_lines(_stderr(client))
        assert notes == ([f"bmoe: {NOTE}"] if extra else [])
    resident, asked = outcomes
    assert isinstance(resident, DecideDone) and isinstance(asked, DecideDone)
    assert len(asked.choice_logp) == len(choices)
    assert asked.choice_logp == resident.choice_logp and asked.best == resident.best
