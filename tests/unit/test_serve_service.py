"""The served session's turns over the scripted backend (no model, no HTTP): the pieces it
streams add up to the answer, a stop string stops the turn and cuts the text, a cancel ends
the job, and a request that sets no max_tokens gets the rest of the context; the live
metrics feed follows its requests."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.requests.api_requests import parse_chat_completion, parse_completion
from bmoe.requests.neutral import Delta
from bmoe.serve.api_responses import ModelCard
from bmoe.serve.errors import RequestCancelledError
from bmoe.serve.live import MIN_INTERVAL_S, MetricsFeed
from bmoe.serve.page import metrics_events
from bmoe.serve.service import ServedSession
from bmoe.service.session_engine import EngineDefaults, SessionEngine
from bmoe.testing.fake_backend import EOG, ScriptedGenerateBackend

TIMEOUT = 10.0


class Template:
    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: object = None,
    ) -> str:
        return "".join(f"<{m.role[0]}>{m.content}" for m in messages) + "<a>"


def spell(answer: str) -> Any:
    """After the last ``<a>`` (or ``|`` in raw text) spell ``answer``, then end."""

    def next_token(context: Sequence[int]) -> int:
        text = bytes(context).decode(errors="replace")
        mark = max(text.rfind("<a>") + 3, text.rfind("|") + 1)
        done = len(text) - mark
        return answer.encode()[done] if done < len(answer.encode()) else EOG

    return next_token


class FakeSession:
    """What ``ServedSession`` uses of a ``Session``, over a ``SessionEngine``."""

    def __init__(self, answer: str, n_ctx: int = 256) -> None:
        self.backend = ScriptedGenerateBackend(n_ctx, spell(answer))
        self.engine = SessionEngine(self.backend, Template(), EngineDefaults(chat=True, n_predict=32))
        self.n_ctx = n_ctx
        self.n_seq = 1  # one request at a time (parallel sequences: tests/gates/test_server_parallel.py)
        self.requests: list[GenerateRequest] = []
        self.results: list[RunResult] = []
        self.closed = False
        self.streaming = None  # resident: no expert cache
        self.governor = None  # ... so no cache governor
        self.prompt_cache = None  # no --cache-ram
        self.feeding = (0, 0)
        self.token_s = 0.0  # how long each token takes (the live feed's tests)

    def generate(
        self, request: GenerateRequest, on_progress: Any = None, on_begin: Any = None, **kw: Any
    ) -> RunResult:
        self.requests.append(request)
        if on_progress is not None and self.token_s:
            report = on_progress

            def on_progress(p: Any) -> None:
                time.sleep(self.token_s)
                report(p)

        result = self.engine.generate(request, on_progress, on_begin, **kw)
        self.results.append(result)
        return result

    def stop(self) -> None:
        self.engine.stop()

    def cancel(self) -> None:
        self.engine.cancel()

    def close(self) -> None:
        self.closed = True


def served(answer: str, n_ctx: int = 256) -> tuple[ServedSession, FakeSession]:
    fake = FakeSession(answer, n_ctx)
    return ServedSession(fake, ModelCard(id="fake", created=0)), fake  # type: ignore[arg-type]


def chat(**fields: Any) -> Any:
    return parse_chat_completion({"messages": [{"role": "user", "content": "q"}], **fields})


def test_the_streamed_pieces_add_up_to_the_answer_and_its_reasoning() -> None:
    s, _ = served("<think>plan</think>\n\nOK then")
    pieces: list[Delta] = []
    o = s.chat(chat(), pieces.append).future.result(TIMEOUT)
    assert (o.text, o.reasoning, o.finish_reason) == ("OK then", "plan", "stop")
    assert "".join(p.text for p in pieces) == "OK then"
    assert "".join(p.reasoning for p in pieces) == "plan"
    assert all(p.text or p.reasoning for p in pieces)
    s.close(TIMEOUT)


def test_a_stop_string_stops_the_turn_and_cuts_the_text_even_split_across_tokens() -> None:
    s, fake = served("one\n\ntwo three four")
    pieces: list[Delta] = []
    o = s.chat(chat(stop=["\n\n"]), pieces.append).future.result(TIMEOUT)
    assert (o.text, o.finish_reason) == ("one", "stop")
    assert "".join(p.text for p in pieces) == "one"
    result = fake.results[-1]
    assert not result.cancelled  # stopped, not cancelled: the turn is kept
    assert len(result.tokens) == len("one\n\n")  # generation stopped at the stop string
    assert o.completion_tokens == len(result.tokens)
    s.close(TIMEOUT)


def test_a_stop_string_in_the_text_the_session_flushed_last_is_cut_too() -> None:
    # "<thi" is held back by the reasoning splitter until the turn ends, then flushed as text
    s, _ = served("<thi")
    pieces: list[Delta] = []
    o = s.chat(chat(stop=["hi"]), pieces.append).future.result(TIMEOUT)
    assert (o.text, o.finish_reason) == ("<t", "stop")
    assert "".join(p.text for p in pieces) == "<t"
    plain: list[Delta] = []
    assert s.chat(chat(), plain.append).future.result(TIMEOUT).text == "<thi"
    assert "".join(p.text for p in plain) == "<thi"
    s.close(TIMEOUT)


def test_no_max_tokens_means_the_rest_of_the_context() -> None:
    s, fake = served("x" * 300, n_ctx=64)
    o = s.chat(chat()).future.result(TIMEOUT)
    prompt = len("<u>q<a>")
    assert fake.requests[-1].n_predict == 64 - prompt
    assert (o.completion_tokens, o.prompt_tokens, o.finish_reason) == (64 - prompt, prompt, "length")
    assert s.chat(chat(max_tokens=3)).future.result(TIMEOUT).completion_tokens == 3
    s.close(TIMEOUT)


def test_a_conversation_continued_reuses_the_prefix() -> None:
    s, _ = served("hi")
    first = s.chat(chat()).future.result(TIMEOUT)
    assert first.cached_tokens == 0
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "more"},
    ]
    second = s.chat(parse_chat_completion({"messages": messages})).future.result(TIMEOUT)
    assert second.prompt_tokens == len("<u>q<a>hi<u>more<a>")
    assert second.cached_tokens == len("<u>q<a>hi")  # the first turn, answer included
    s.close(TIMEOUT)


def test_a_completion_is_raw_text() -> None:
    s, fake = served("xy")
    o = s.complete(parse_completion({"prompt": "ab|", "max_tokens": 5})).future.result(TIMEOUT)
    assert o.text == "xy" and o.prompt_tokens == 3
    assert bytes(fake.backend.context).decode() == "ab|xy"
    s.close(TIMEOUT)


def test_a_cancelled_turn_ends_its_job_with_an_error() -> None:
    s, fake = served("abcdefgh")
    jobs: list[Any] = []
    submitted = threading.Event()

    def cancel_at_the_first_piece(p: Delta) -> None:
        assert submitted.wait(TIMEOUT)
        jobs[0].cancel()

    jobs.append(s.chat(chat(), cancel_at_the_first_piece))
    submitted.set()
    with pytest.raises(RequestCancelledError):
        jobs[0].future.result(TIMEOUT)
    assert fake.results[-1].cancelled
    assert len(fake.results[-1].tokens) == 1
    s.close(TIMEOUT)
    assert fake.closed


def test_progress_is_not_needed_for_the_answer() -> None:
    # a turn that ends at once (an end token first) still answers
    s, _ = served("")
    o = s.chat(chat()).future.result(TIMEOUT)
    assert (o.text, o.completion_tokens, o.finish_reason) == ("", 0, "stop")
    s.close(TIMEOUT)


# -- the live metrics feed (GET /v1/bmoe/metrics's events, without HTTP) ---------------------


async def _events_until_finished(s: ServedSession, start: Any, finished: int) -> list[tuple[float, Any]]:
    """The feed's events (with when they came) from its first until one says ``finished``
    requests have ended; ``start()`` is called once the first event is in."""
    feed = MetricsFeed(s.model_id, s.streaming)
    events = metrics_events(s, feed)
    loop = asyncio.get_running_loop()
    seen = [(loop.time(), json.loads((await anext(events)).data))]
    start()
    try:
        while seen[-1][1]["requests"] < finished:
            event = await asyncio.wait_for(anext(events), TIMEOUT)
            seen.append((loop.time(), json.loads(event.data)))
    finally:
        await events.aclose()
    return seen


def test_the_metrics_feed_follows_a_chat_at_most_ten_times_a_second_and_always_after_its_end() -> None:
    s, fake = served("<think>plan</think>\n\n" + "OK " * 40)
    fake.token_s = 0.01  # about a second in all
    jobs: list[Any] = []
    seen = asyncio.run(_events_until_finished(s, lambda: jobs.append(s.chat(chat(max_tokens=64))), 1))
    jobs[0].future.result(TIMEOUT)
    first, last = seen[0][1], seen[-1][1]
    assert first == {
        "model": "fake",
        "state": "idle",
        "requests": 0,
        "streaming": False,
        "request": None,
        "cache": None,
        "slots": {"total": 1, "busy": 0, "waiting": 0},
        "prompt_cache": None,
    }
    assert last["state"] == "idle" and last["cache"] is None
    r = last["request"]
    tokens = len(fake.results[-1].tokens)
    assert (r["number"], r["kind"], r["outcome"]) == (1, "chat", "done")
    assert (r["tokens"], r["max_tokens"]) == (tokens, 64)
    assert r["tok_s"] > 0
    assert (r["prefill_done"], r["prefill_total"]) == (0, 0)  # the scripted backend tells no progress
    assert r["hit_pct"] is None and r["read_mib_per_token"] is None and r["stall_ms_per_token"] is None
    assert len(seen) >= 5
    assert all(e["state"] in ("prefill", "decode") for _, e in seen[1:-1])
    counts = [e["request"]["tokens"] for _, e in seen[1:]]
    assert counts == sorted(counts)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(seen)]
    assert all(gap >= MIN_INTERVAL_S * 0.9 for gap in gaps)
    s.close(TIMEOUT)


def test_the_metrics_feed_says_a_request_was_cancelled() -> None:
    s, _ = served("abcdefgh")
    jobs: list[Any] = []
    submitted = threading.Event()

    def cancel_at_the_first_piece(p: Delta) -> None:
        assert submitted.wait(TIMEOUT)
        jobs[0].cancel()

    def start() -> None:
        jobs.append(s.chat(chat(), cancel_at_the_first_piece))
        submitted.set()

    seen = asyncio.run(_events_until_finished(s, start, 1))
    assert seen[-1][1]["request"]["outcome"] == "cancelled"
    assert seen[-1][1]["state"] == "idle"
    s.close(TIMEOUT)
