"""Response bodies, stream chunks and error bodies of the server, from bmoe's values (no model)."""

from __future__ import annotations

import json
import math

import pytest

from bmoe.domain.decide import DecideRequest, DecideResult
from bmoe.domain.generation import RunResult
from bmoe.errors import (
    ChoiceCollisionError,
    ConfigError,
    ContextOverflowError,
    DecideDisabledError,
    DecodeError,
    ExpertReadError,
    GrammarError,
    RequestError,
    SessionFailedError,
)
from bmoe.requests.neutral import Delta, Outcome, outcome
from bmoe.serve import api_responses as api
from bmoe.serve.api_responses import Envelope, ModelCard
from bmoe.serve.errors import RequestCancelledError, ServerClosedError, api_error

ENV = Envelope(id="chatcmpl-1", created=100, model="tiny")


def result(**kw: object) -> RunResult:
    fields: dict[str, object] = {
        "text": "OK",
        "reasoning": "",
        "tokens": (5, 6, 7),
        "n_prompt": 4,
        "n_past": 13,
        "prefill_s": 0.1,
        "decode_s": 0.2,
    }
    return RunResult(**{**fields, **kw})  # type: ignore[arg-type]


def test_usage_counts_the_whole_prompt_and_what_its_kv_reused() -> None:
    o = outcome(result(), "OK", stopped=False)
    # 13 in the context after the turn, 3 of them generated: a 10-token prompt, 4 prefilled
    assert (o.prompt_tokens, o.completion_tokens, o.cached_tokens) == (10, 3, 6)
    assert api.usage(o) == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 6},
    }


@pytest.mark.parametrize(
    ("eog", "stopped", "reason"), [(True, False, "stop"), (False, True, "stop"), (False, False, "length")]
)
def test_the_finish_reason(eog: bool, stopped: bool, reason: str) -> None:
    assert outcome(result(stopped_at_eog=eog), "OK", stopped=stopped).finish_reason == reason


def test_the_answer_is_the_cut_text_and_the_reasoning_rides_apart() -> None:
    o = outcome(result(text="OK then", reasoning="plan"), "OK", stopped=True)
    body = api.chat_completion(ENV, o)
    assert body["id"] == "chatcmpl-1" and body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "OK", "reasoning_content": "plan"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    plain = api.chat_completion(ENV, outcome(result(), "OK", stopped=False))
    assert "reasoning_content" not in plain["choices"][0]["message"]


def test_stream_chunks() -> None:
    chunk = api.chat_chunk(ENV, api.chat_delta(Delta("a", "r")))
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"] == [
        {
            "index": 0,
            "delta": {"reasoning_content": "r", "content": "a"},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert api.chat_delta(Delta("", "r")) == {"reasoning_content": "r"}
    o = Outcome("a", "", "length", 3, 1, 0)
    assert api.usage_chunk(ENV, "chat.completion.chunk", o)["choices"] == []
    text = api.text_chunk(ENV, Delta("t"), "length")
    assert text["object"] == "text_completion"
    assert text["choices"] == [{"text": "t", "index": 0, "logprobs": None, "finish_reason": "length"}]


def test_a_text_completion() -> None:
    body = api.text_completion(ENV, outcome(result(text="xyz"), "xyz", stopped=False))
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "xyz"
    assert body["usage"]["total_tokens"] == 13


def test_a_decision_carries_the_protocols_keys_and_minus_infinity_as_null() -> None:
    request = DecideRequest(suffix="s", choices=("A", "B"))
    decided = DecideResult(
        best=0, choice_logp=(-0.1, -math.inf), n_reused=2, n_prefilled=5, prefill_s=0.5, prefix_plan="kept"
    )
    body = api.decision(ENV, request, decided)
    json.dumps(body, allow_nan=False)  # valid JSON: no infinity left
    assert body["object"] == "bmoe.decision"
    assert body["choices"] == ["A", "B"]
    assert body["choice_logp"] == [-0.1, None]
    assert body["choice_p_renorm"] == [1.0, 0.0]
    assert (body["best"], body["n_tokens"], body["n_reused"], body["n_prefilled"]) == (0, 7, 2, 5)
    assert body["prefill_tps"] == 10.0
    assert body["prefill_read_mib"] == -1.0  # not streaming: not measured
    assert body["prefix_plan"] == "kept"


def test_the_model_list() -> None:
    body = api.model_list(ModelCard(id="tiny", created=5, meta={"arch": "qwen3moe"}))
    assert body == {
        "object": "list",
        "data": [
            {"id": "tiny", "object": "model", "created": 5, "owned_by": "bmoe", "meta": {"arch": "qwen3moe"}}
        ],
    }


@pytest.mark.parametrize(
    ("exc", "status", "kind", "param", "code"),
    [
        (RequestError("bad", "temperature"), 400, "invalid_request_error", "temperature", None),
        (
            RequestError("no", "n", "unsupported_parameter"),
            400,
            "invalid_request_error",
            "n",
            "unsupported_parameter",
        ),
        (
            ContextOverflowError("too long"),
            400,
            "invalid_request_error",
            "messages",
            "context_length_exceeded",
        ),
        (DecideDisabledError("off"), 400, "invalid_request_error", None, "decide_disabled"),
        (ChoiceCollisionError("same", 0, 1, 5), 400, "invalid_request_error", "choices", "invalid_choices"),
        (ConfigError("template"), 400, "invalid_request_error", None, "invalid_value"),
        (ConfigError("no", "grammar"), 400, "invalid_request_error", "grammar", "invalid_value"),
        (
            GrammarError("x", "tools[0].function.parameters#/not"),
            400,
            "invalid_request_error",
            "tools[0].function.parameters#/not",
            "invalid_grammar",
        ),
        (SessionFailedError("gone"), 503, "server_error", None, "session_unavailable"),
        (ExpertReadError("read"), 503, "server_error", None, "session_unavailable"),
        (ServerClosedError("closing"), 503, "server_error", None, "session_unavailable"),
        (RequestCancelledError("cancelled"), 503, "server_error", None, "session_unavailable"),
        (DecodeError("decode failed", -3), 500, "server_error", None, "session_failed"),
        (RuntimeError("bug"), 500, "server_error", None, None),
    ],
)
def test_errors_take_openais_shape_and_a_status_by_who_is_at_fault(
    exc: BaseException, status: int, kind: str, param: str | None, code: str | None
) -> None:
    err = api_error(exc)
    assert err.status == status
    assert err.body() == {"error": {"message": err.message, "type": kind, "param": param, "code": code}}
    assert str(exc) in err.message
