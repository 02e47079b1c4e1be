"""Protocol fuzzing: a real ``--session`` process fed generated lines survives every one.

After each generated line the test sends a sentinel request (an unknown ``cmd`` with its own
id) and reads every response up to the sentinel's refusal, within a bound: each response
must parse, no error may be fatal, the process must stay up. A last valid request must then
answer what a fresh process answers.

Lines: valid requests, truncated ones, wrong types, unknown keys, huge strings, lines over
the 1 MiB limit, deep nesting, bytes that are not UTF-8, lone surrogates (escaped and raw),
NUL bytes, numbers like ``1e999`` and integers of thousands of digits.

``BMOE_FUZZ_EXAMPLES`` sets the number of examples (each one to four lines); the default
keeps the run to well under a minute. docs/testing.md has the longer profile.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bmoe.adapters.protocol import (
    Begin,
    CloseCmd,
    DecideDone,
    Done,
    Error,
    Progress,
    parse_request,
)
from bmoe.client import SessionClient, SessionClientError

TinyModel = Callable[[str], Path]

EXAMPLES = int(os.environ.get("BMOE_FUZZ_EXAMPLES", "800"))
LINE_BOUND_S = 30.0  # the most one line (and its sentinel) may take to be answered
SENTINEL_MSG_START = 'unknown cmd "fuzz-sentinel"'

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
request_id = st.one_of(st.none(), st.integers(-(2**63), 2**63), st.text(max_size=12))
prompt_text = st.text(min_size=0, max_size=40) | st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfff", "é"])


@st.composite
def valid_request(draw: st.DrawFn) -> dict[str, object]:
    cmd = draw(st.sampled_from(["generate", "decide", "cancel"]))
    req: dict[str, object] = {"cmd": cmd}
    if draw(st.booleans()):
        req["id"] = draw(request_id)
    if cmd == "generate":
        req["prompt"] = draw(prompt_text)
        if draw(st.booleans()):
            req["n_predict"] = draw(st.integers(0, 12) | st.integers(-5, 10**6) | st.none())
        if draw(st.booleans()):
            req["think"] = draw(st.booleans() | st.none())
        if draw(st.booleans()):
            req["clear_kv"] = draw(st.booleans())
    elif cmd == "decide":
        req["prefix"] = draw(prompt_text)
        req["suffix"] = draw(prompt_text)
        req["choices"] = draw(st.lists(st.text(max_size=6), max_size=4))
        if draw(st.booleans()):
            req["reuse_prefix"] = draw(st.booleans())
    return req


def _dumps(obj: object) -> bytes:
    # surrogatepass: a lone surrogate the strategy drew goes out as raw (invalid) UTF-8 bytes
    return json.dumps(obj, ensure_ascii=draw_ascii(obj)).encode("utf-8", "surrogatepass")


def draw_ascii(obj: object) -> bool:
    return len(json.dumps(obj)) % 2 == 0  # both spellings of text: \u escapes and raw UTF-8


@st.composite
def mutated_request(draw: st.DrawFn) -> bytes:
    req = draw(valid_request())
    how = draw(st.sampled_from(["wrong_type", "extra_key", "drop_key", "truncate", "null_cmd"]))
    if how == "wrong_type":
        req[draw(st.sampled_from([*req.keys(), "id"]))] = draw(json_value)
    elif how == "extra_key":
        req[draw(st.text(max_size=10))] = draw(json_value)
    elif how == "drop_key":
        req.pop(draw(st.sampled_from(list(req.keys()))))
    elif how == "null_cmd":
        req["cmd"] = draw(json_value)
    line = _dumps(req)
    if how == "truncate":
        line = line[: draw(st.integers(0, max(0, len(line) - 1)))]
    return line


special_lines = st.sampled_from(
    [
        b"",
        b"   \t ",
        b"\xef\xbb\xbf" + b'{"cmd":"generate","prompt":"bom","n_predict":1}',
        b'{"cmd":"generate","prompt":"\\ud800","n_predict":2}',
        b'{"cmd":"generate","prompt":"\\udc00\\ud800x","n_predict":2}',
        b'{"cmd":"generate","prompt":"\xed\xa0\x80"}',
        b'{"cmd":"decide","prefix":"\\ud800","choices":["A","B"]}',
        b'{"cmd":"decide","prefix":"x","choices":["\\ud800","\\udc00"]}',
        b'{"cmd":"generate","prompt":"\\u0000","n_predict":2}',
        b'{"cmd":"generate","prompt":"a\x00b"}',
        b'\x00{"cmd":"generate","prompt":"x"}',
        b'{"cmd":"generate","prompt":"x","n_predict":1e999}',
        b'{"cmd":"generate","prompt":"x","n_predict":-1e999}',
        b'{"cmd":"generate","prompt":"x","n_predict":1e-999}',
        b'{"cmd":"generate","prompt":"x","n_predict":' + b"9" * 5000 + b"}",
        b'{"cmd":"generate","prompt":"x","n_predict":' + b"9" * 30 + b"}",
        b'{"cmd":"generate","prompt":"x","id":' + b"9" * 4000 + b"}",
        b'{"cmd":"generate","prompt":"x","id":1e999}',
        b'{"cmd":"generate","prompt":"x","n_predict":NaN}',
        b'{"cmd":"generate","prompt":"x","n_predict":Infinity}',
        b'{"cmd":"generate","prompt":"x","n_predict":-Infinity}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b"[" * 100_000,
        b'{"cmd":"generate","prompt":"x",}',
        b'{"cmd":"generate","prompt":"x"} trailing',
        b'{"cmd":"generate","prompt":"x"}{"cmd":"generate","prompt":"y"}',
        b'"just a string"',
        b"12345",
        b"null",
        b"\xff\xfe\xfd",
        b"\xc3",
        b'{"cmd":"generate","prompt":"\xc3"}',
        b'{"cmd":"generate","prompt":"\xf4\x90\x80\x80"}',
        b'{"cmd":"generate","id":"\xed\xb0\x80","prompt":"x"}',
        b'{"cmd":"generate","prompt":"x","n_predict":1,"n_predict":2}',
        b'{"cmd":"decide","prefix":"Pick","choices":["A","A"]}',
        b'{"cmd":"decide","prefix":"Pick","choices":[]}',
        b'{"cmd":"cancel","id":"nothing-runs"}',
        b'{"cmd":"cancel","id":[1]}',
    ]
)


@st.composite
def huge_line(draw: st.DrawFn) -> bytes:
    """A prompt of up to a few hundred KiB, or a line just past the 1 MiB limit."""
    if draw(st.booleans()):
        n = draw(st.integers(1_000, 300_000))
        return b'{"cmd":"generate","prompt":"' + b"ab " * (n // 3) + b'"}'
    return b"x" * ((1 << 20) + draw(st.integers(1, 70_000)))


fuzz_line = st.one_of(
    valid_request().map(_dumps),
    mutated_request(),
    special_lines,
    st.binary(max_size=60),
    st.text(max_size=60).map(lambda s: s.encode("utf-8", "surrogatepass")),
    json_value.map(_dumps),
    huge_line(),
)


class Proc:
    """The session process under test, restarted when an example killed it (so shrinking
    gets a live process)."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.client: SessionClient | None = None
        self.sentinels = 0
        self.lines = 0

    def get(self) -> SessionClient:
        if self.client is None or self.client.process.poll() is not None:
            if self.client is not None:
                self.client.close()
            self.client = SessionClient(self.args, timeout=LINE_BOUND_S)
        return self.client

    def kill(self) -> None:
        if self.client is not None:
            self.client.process.kill()
            self.client.close()
            self.client = None


def _is_close(line: bytes) -> bool:
    return isinstance(parse_request(line), CloseCmd)


def feed_and_check(proc: Proc, line: bytes) -> list[object]:
    """Send ``line`` and a sentinel; every response up to the sentinel's, all non-fatal."""
    client = proc.get()
    proc.sentinels += 1
    sentinel = f"s{proc.sentinels}"
    client.send_raw(line + b"\n" + json.dumps({"cmd": "fuzz-sentinel", "id": sentinel}).encode() + b"\n")
    proc.lines += 1
    seen: list[object] = []
    try:
        while True:
            response = client.next_response()
            seen.append(response)
            assert isinstance(response, Begin | Progress | Done | DecideDone | Error), response
            if isinstance(response, Error):
                assert not response.fatal, (line[:300], response)
                assert "\n" not in response.msg
                if response.id == sentinel:
                    assert response.msg.startswith(SENTINEL_MSG_START)
                    return seen
    except (SessionClientError, AssertionError, ValueError):
        proc.kill()  # a dead or hung process: the next example gets a fresh one
        raise


ARGS_EXTRA = ["--chatml", "--no-think", "-c", "256", "-n", "8", "--decide"]


def test_fuzzed_lines_never_end_or_hang_the_session(tiny_model_path: TinyModel) -> None:
    args = ["-m", str(tiny_model_path("qwen3moe")), *ARGS_EXTRA]
    proc = Proc(args)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(st.lists(fuzz_line, min_size=1, max_size=4))
    def run(lines: list[bytes]) -> None:
        for line in lines:
            line = line.replace(b"\n", b" ")
            if _is_close(line):
                continue
            feed_and_check(proc, line)

    try:
        run()
        client = proc.get()
        after = client.generate("Hello there", id="final", n_predict=8)
        assert client.close() == 0
        print(f"fuzz: {proc.lines} lines fed to one session process")  # docs/reliability.md quotes it
    finally:
        proc.kill()
    with SessionClient(args) as fresh:
        expected = fresh.generate("Hello there", id="final", n_predict=8)
    assert (after.text, after.tokens, after.n_past) == (expected.text, expected.tokens, expected.n_past)
    print(f"fuzzed {proc.lines} lines")


@pytest.mark.parametrize(
    "line",
    [
        b'{"cmd":"generate","prompt":"\\ud800","n_predict":2}',
        b'{"cmd":"decide","prefix":"\\ud800","choices":["A","B"]}',
        b'{"cmd":"generate","prompt":"a\\u0000b","n_predict":2}',
        b'{"cmd":"generate","prompt":"x","n_predict":' + b"9" * 5000 + b"}",
        b"[" * 100_000,
        b"x" * ((1 << 20) + 5),
    ],
)
def test_pinned_lines_are_refused_or_answered(tiny_model_path: TinyModel, line: bytes) -> None:
    proc = Proc(["-m", str(tiny_model_path("qwen3moe")), *ARGS_EXTRA])
    try:
        feed_and_check(proc, line)
    finally:
        proc.kill()
