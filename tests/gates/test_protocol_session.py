"""The ``--session`` line protocol end to end, through ``SessionClient`` and a real process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.protocol import Begin, DecideDone, Done, Error, Progress
from bmoe.client import SessionClient

TinyModel = Callable[[str], Path]


@pytest.fixture(scope="module")
def client(tiny_model_path: TinyModel) -> SessionClient:
    args = ["-m", str(tiny_model_path("qwen3moe")), "--chatml", "--no-think", "-c", "256", "-n", "8"]
    with SessionClient(args) as c:
        yield c


def test_ready_describes_the_model(client: SessionClient) -> None:
    ready = client.ready
    assert (ready.arch, ready.n_ctx, ready.n_expert_used, ready.think_ctl) == ("qwen3moe", 256, 2, True)


@pytest.mark.parametrize(
    ("line", "rid", "msg"),
    [
        (b"not json\n", None, "not JSON: Expecting value at column 1"),
        (b"[1, 2]\n", None, "a request must be a JSON object"),
        (b'{"id": 7}\n', 7, 'missing "cmd"'),
        (
            b'{"cmd": "generat", "id": 8}\n',
            8,
            'unknown cmd "generat" (expected one of: cancel, close, decide, generate)',
        ),
        (
            b'{"cmd": "generate", "id": 9, "prompt": "x", "n_predict": "5"}\n',
            9,
            'field "n_predict" must be an integer, got string',
        ),
        (
            b'{"cmd": "generate", "id": 10, "prompt": "x", "think": 1}\n',
            10,
            'field "think" must be a boolean, got integer',
        ),
        (b'{"cmd": "generate", "id": 11, "prompt": ""}\n', 11, "empty prompt"),
        (b'{"cmd": "generate", "id": 12}\n', 12, 'missing field "prompt" in generate'),
        (
            b'{"cmd": "generate", "id": 13, "prompt": "x", "n_predit": 3}\n',
            13,
            'unknown field "n_predit" in generate',
        ),
    ],
)
def test_a_bad_line_gets_a_non_fatal_error_and_the_next_line_is_served(
    client: SessionClient, line: bytes, rid: object, msg: str
) -> None:
    client.send_raw(line)
    assert client.next_response() == Error(id=rid, fatal=False, msg=msg)
    assert client.generate("Still there?", n_predict=3).tokens == 3


def test_overflow_is_refused_and_the_session_goes_on(client: SessionClient) -> None:
    responses = list(client.stream_generate("Too long", id="o", n_predict=1000))
    assert responses[0] == Begin(id="o")
    final = responses[-1]
    assert final == Error(
        id="o",
        fatal=False,
        msg="prompt (22 tokens) + n_predict (1000) = 1022 exceeds the context of 256 tokens",
    )
    assert client.generate("Fine now", n_predict=2).tokens == 2


def test_decide_without_the_flag_is_refused_non_fatally(client: SessionClient) -> None:
    final = client.decide("Pick one:", "", ["yes", "no"], id="d")
    assert final == Error(
        id="d", fatal=False, msg="decide is not enabled in this session (start it with --decide)"
    )


def test_a_two_turn_chat_reuses_the_prefix_and_matches_a_fresh_process(
    client: SessionClient, tiny_model_path: TinyModel
) -> None:
    first = client.generate("Hello there", id="t1")
    second = client.generate("And then?", id="t2", clear_kv=False)
    assert second.n_prompt < second.n_past - second.tokens
    args = ["-m", str(tiny_model_path("qwen3moe")), "--chatml", "--no-think", "-c", "256", "-n", "8"]
    with SessionClient(args) as other:
        again1 = other.generate("Hello there", id="t1")
        again2 = other.generate("And then?", id="t2", clear_kv=False)
    assert (again1.text, again2.text) == (first.text, second.text)


def test_cancel_stops_the_request_in_flight(tiny_model_path: TinyModel) -> None:
    args = ["-m", str(tiny_model_path("qwen3moe")), "-c", "4096", "--progress"]
    with SessionClient(args) as client:
        stream = client.stream_generate("Count", id="long", n_predict=4000)
        assert next(stream) == Begin(id="long")
        assert isinstance(next(stream), Progress)
        client.cancel()
        final = list(stream)[-1]
        assert isinstance(final, Done) and final.cancelled and final.id == "long"
        assert final.tokens < 4000
        after = client.generate("Again", n_predict=3)
        assert not after.cancelled and after.tokens == 3
        assert client.close() == 0


def test_end_of_input_closes_cleanly(tiny_model_path: TinyModel) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe.cli", "--session", "-m", str(tiny_model_path("qwen3moe"))],
        input=b'{"cmd":"generate","id":1,"prompt":"Hi","n_predict":2}',  # no final newline
        capture_output=True,
        timeout=120,
    )
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 0
    assert [line.split(" ", 1)[0] for line in lines] == ["BMOE_READY", "BMOE_BEGIN", "BMOE_DONE"]


def test_a_model_that_cannot_load_is_one_fatal_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe.cli", "--session", "-m", str(missing)],
        input=b"",
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert (
        proc.stdout.decode()
        == f'BMOE_ERROR {{"id":null,"fatal":true,"msg":"model file not found: {missing}"}}\n'
    )


def test_decisions_over_the_protocol(tiny_model_path: TinyModel) -> None:
    args = ["-m", str(tiny_model_path("qwen3moe")), "--chatml", "--decide", "-c", "512"]
    prefix = "You control a phone. Task: turn on Wi-Fi. "
    with SessionClient(args) as client:
        first = client.decide(prefix, "Options: A) Network B) Display.", ["A", "B"], id="d1")
        second = client.decide(prefix, "Options: A) Wi-Fi B) Bluetooth.", ["A", "B"], id="d2")
        refused = client.decide(prefix, "?", ["Yes", "Yes"], id="d3")
        whole = client.decide(
            prefix, "Options: A) Wi-Fi B) Bluetooth.", ["A", "B"], id="d4", reuse_prefix=False
        )
    assert isinstance(first, DecideDone) and isinstance(second, DecideDone) and isinstance(whole, DecideDone)
    assert first.n_reused == 0 and second.n_reused > 0
    assert second.n_tokens == second.n_reused + second.n_prefilled
    assert whole.n_reused == 0 and whole.best == second.best
    assert first.prefix_state_mib > 0 and len(first.choice_logp) == 2
    assert abs(sum(p for p in first.choice_p_renorm if p is not None) - 1.0) < 1e-9
    assert isinstance(refused, Error) and not refused.fatal and "start with the same token" in refused.msg


def test_a_prompt_that_is_not_valid_unicode_is_refused_and_the_session_goes_on(client: SessionClient) -> None:
    """A JSON escape of a lone surrogate used to end the whole session with a traceback."""
    client.send_raw(b'{"cmd": "generate", "id": 40, "prompt": "\\ud800"}\n')
    assert client.next_response() == Begin(id=40)  # accepted, then refused by the tokenizer
    error = client.next_response()
    assert isinstance(error, Error) and error.id == 40 and not error.fatal
    assert "not valid Unicode" in error.msg
    assert not client.generate("Hello", n_predict=2).cancelled
