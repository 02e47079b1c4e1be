"""Ollama's answers written from the neutral result (no model, no HTTP), each read back by
the ``ollama`` client's own types: a whole reply, a streamed one (pieces, the calls, the
``done`` object), thinking, log-probabilities, probes, the model's listings and errors."""

from __future__ import annotations

import datetime
import time

import attrs
import ollama
import pytest

from bmoe.domain.generation import TokenChoice, TokenLogprob
from bmoe.domain.tools import ToolCall
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.errors import ApiError, NotServedError, api_error
from bmoe.serve.guards import dialect_of
from bmoe.serve.ollama_replies import NS, ModelFacts, OllamaWriter, version_body

CALL = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')


def outcome(text: str = "Hi there", **kw: object) -> Outcome:
    fields: dict[str, object] = {
        "text": text,
        "reasoning": "",
        "finish_reason": "stop",
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "cached_tokens": 3,
        "prefill_s": 0.25,
        "decode_s": 0.5,
        **kw,
    }
    return Outcome(**fields)  # type: ignore[arg-type]


def writer(*, chat: bool = True, logprobs: bool = False) -> OllamaWriter:
    return OllamaWriter("qwen3:latest", chat=chat, started_ns=time.perf_counter_ns(), logprobs=logprobs)


def test_a_whole_chat_reply_is_one_done_object_with_counts_and_nanoseconds() -> None:
    body = writer().whole(outcome())
    reply = ollama.ChatResponse(**body)
    assert reply.message.role == "assistant" and reply.message.content == "Hi there"
    assert (reply.done, reply.done_reason, reply.model) == (True, "stop", "qwen3:latest")
    assert (reply.prompt_eval_count, reply.eval_count) == (10, 4)
    assert (reply.prompt_eval_duration, reply.eval_duration, reply.load_duration) == (NS // 4, NS // 2, 0)
    assert reply.total_duration is not None and reply.total_duration >= 0
    assert reply.created_at is not None
    assert datetime.datetime.fromisoformat(reply.created_at).tzinfo is not None
    assert reply.message.thinking is None and "thinking" not in body["message"]


def test_a_cut_reply_is_done_for_length_and_calls_come_in_ollamas_shape() -> None:
    assert writer().whole(outcome(finish_reason="length"))["done_reason"] == "length"
    body = writer().whole(outcome(" \n", finish_reason="tool_calls", tool_calls=(CALL,)))
    reply = ollama.ChatResponse(**body)
    assert reply.done_reason == "stop" and reply.message.content == ""
    assert reply.message.tool_calls is not None
    (call,) = reply.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Oslo"})
    assert body["message"]["tool_calls"][0]["id"] == "call_1"
    cut = writer().whole(outcome("", tool_calls=(ToolCall("c", "f", '{"a": '),)))
    assert cut["message"]["tool_calls"][0]["function"]["arguments"] == {}  # cut short: an object still


def test_a_streamed_chat_is_pieces_then_the_calls_then_done() -> None:
    w = writer()
    assert w.delta(Delta()) == [] and w.delta(Delta(call_deltas=())) == []
    parts = [*w.delta(Delta(reasoning="hm")), *w.delta(Delta(text="Hi")), *w.delta(Delta(tool_calls=(CALL,)))]
    parts += w.finish(outcome("Hi", tool_calls=(CALL,), finish_reason="tool_calls"))
    replies = [ollama.ChatResponse(**p) for p in parts]
    assert [r.done for r in replies] == [False, False, False, True]
    assert replies[0].message.thinking == "hm" and replies[0].message.content == ""
    assert replies[1].message.content == "Hi"
    assert (
        replies[2].message.tool_calls is not None
        and replies[2].message.tool_calls[0].function.name == "get_weather"
    )
    assert replies[3].message.content == "" and replies[3].eval_count == 4


def test_generate_replies_carry_response_and_thinking() -> None:
    w = writer(chat=False)
    (piece,) = w.delta(Delta(text="Once", reasoning="r"))
    last = w.finish(outcome("Once"))[-1]
    whole = writer(chat=False).whole(outcome("Once upon", reasoning="so"))
    for body in (piece, last, whole):
        ollama.GenerateResponse(**body)
    assert (piece["response"], piece["thinking"], piece["done"]) == ("Once", "r", False)
    assert (last["response"], last["done"], last["done_reason"]) == ("", True, "stop")
    assert (whole["response"], whole["thinking"]) == ("Once upon", "so")


def test_log_probabilities_are_listed_with_their_alternatives() -> None:
    lp = TokenLogprob(
        TokenChoice(5, b"Hi", -0.5), (TokenChoice(5, b"Hi", -0.5), TokenChoice(6, b"Yo", float("-inf")))
    )
    (piece,) = writer(logprobs=True).delta(Delta(text="Hi", logprobs=(lp,)))
    reply = ollama.ChatResponse(**piece)
    assert reply.logprobs is not None
    assert (reply.logprobs[0].token, reply.logprobs[0].logprob) == ("Hi", -0.5)
    assert [t.token for t in reply.logprobs[0].top_logprobs or []] == ["Hi", "Yo"]
    whole = writer(logprobs=True).whole(outcome("Hi", logprobs=(lp,)))
    assert whole["logprobs"][0]["top_logprobs"][1]["logprob"] == -9999.0  # JSON has no -inf
    assert "logprobs" not in writer().delta(Delta(text="Hi", logprobs=(lp,)))[0]


def test_a_probe_is_answered_done_for_load_or_unload() -> None:
    body = writer().probe("unload")
    reply = ollama.ChatResponse(**body)
    assert (reply.done, reply.done_reason, reply.message.content) == (True, "unload", "")


def test_the_listings_read_as_the_client_reads_them() -> None:
    facts = ModelFacts(
        name="qwen3:latest",
        size=4_567_072,
        modified_at="2026-01-02T03:04:05Z",
        digest="ab" * 32,
        family="qwen3moe",
        parameter_count=30_532_122_624,
        quantization_level="Q4_K_M",
        context_length=4096,
        template="{{ messages }}",
        capabilities=("completion", "tools", "vision"),
    )
    (listed,) = ollama.ListResponse(**facts.tags_body()).models
    assert (listed.model, listed.size, listed.details and listed.details.parameter_size) == (
        "qwen3:latest",
        4_567_072,
        "30.5B",
    )
    shown = ollama.ShowResponse(**facts.show_body())
    assert shown.capabilities == ["completion", "tools", "vision"] and shown.template == "{{ messages }}"
    assert shown.modelinfo is not None and shown.modelinfo["qwen3moe.context_length"] == 4096
    (running,) = ollama.ProcessResponse(**facts.ps_body()).models
    assert running.context_length == 4096 and running.expires_at is not None
    assert attrs.evolve(facts, parameter_count=494_032_768).parameter_size == "494.03M"
    assert version_body()["version"].count(".") == 2


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/api/chat", "ollama"),
        ("/api/tags", "ollama"),
        ("/v1/messages", "anthropic"),
        ("/v1/chat/completions", "openai"),
    ],
)
def test_errors_on_ollamas_routes_are_its_one_string_shape(path: str, dialect: str) -> None:
    assert dialect_of(path) == dialect
    err = ApiError(404, "model 'x' not found", "invalid_request_error")
    assert err.body_for("ollama") == {"error": "model 'x' not found"}
    assert err.body_for(dialect) == (
        err.ollama_body()
        if dialect == "ollama"
        else err.anthropic_body()
        if dialect == "anthropic"
        else err.body()
    )
    assert api_error(NotServedError("/api/pull is not served")).status == 501
