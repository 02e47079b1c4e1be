"""The live engine view on the tiny models: the streamer's snapshot (residency and routing
counts) against what the session knows, and ``GET /v1/bmoe/metrics`` and the page's files
served by a real server, streamed and resident."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server import TIMEOUT, Running, serving  # the in-process server of test_server.py

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.live import ExpertSnapshot
from bmoe.domain.streaming import MIB, StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures import FIXTURES, fixture_path

REQUEST = GenerateRequest("Hello there, how are you", n_predict=12)


def _streamed_snapshot(name: str, policy: str) -> tuple[ExpertSnapshot, ExpertSnapshot, Any, int]:
    stream = StreamConfig(enabled=True, cache_mb=None, policy=policy)
    config = SessionConfig(model_path=fixture_path(name), context=ContextParams(n_ctx=256), stream=stream)
    with Session.open(config) as s:
        assert s.streaming is not None, s.notes
        s.streaming.set_budget(5 * s.streaming.info.entry_bytes)  # evicting: not all resident
        before = s.streaming.snapshot(TIMEOUT)
        result = s.generate(REQUEST)
        after = s.streaming.snapshot(TIMEOUT)
        assert before is not None and after is not None
        entries = set(s.streaming.resident_entries())
        assert {
            (i // after.n_expert, i % after.n_expert) for i, f in enumerate(after.resident) if f
        } == entries
        streamer = s.streaming.streaming.streamer
        assert after.counters.resident_bytes == sum(streamer.entry_bytes(layer) for layer, _ in entries)
        return before, after, result, s.n_expert_used


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_snapshot_counts_every_routed_slot_and_shows_what_the_cache_holds(name: str) -> None:
    before, fast, result, k = _streamed_snapshot(name, "fast")
    assert sum(before.routed) == 0  # the setup's capture decode routes nothing
    first = fast.layers[0] * fast.n_expert
    fed = result.n_prompt + len(result.tokens) - (0 if result.stopped_at_eog else 1)
    assert sum(fast.routed[first : first + fast.n_expert]) == k * fed  # k slots per token fed
    assert all(
        fast.routed[layer * fast.n_expert + e] == 0
        for layer in range(fast.n_layer)
        if layer not in fast.layers
        for e in range(fast.n_expert)
    )
    _, reference, ref_result, _ = _streamed_snapshot(name, "reference")
    assert ref_result.tokens == result.tokens
    assert (reference.resident, reference.routed) == (fast.resident, fast.routed)


def _metrics_until(url: str, start: Any, done: Any) -> list[dict[str, Any]]:
    """Read ``GET /v1/bmoe/metrics`` until ``done(event)``; ``start()`` runs (here) once the
    first event is in."""
    events: queue.Queue[dict[str, Any] | BaseException] = queue.Queue()

    def read() -> None:
        try:
            with httpx.stream("GET", url, timeout=TIMEOUT) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        events.put(event)
                        if done(event):
                            return
        except BaseException as exc:
            events.put(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen = []
    while True:
        item = events.get(timeout=TIMEOUT)
        if isinstance(item, BaseException):
            raise item
        seen.append(item)
        if len(seen) == 1:
            start()
        if done(item):
            break
    reader.join(TIMEOUT)
    return seen


def _chat(s: Running, max_tokens: int) -> Any:
    return s.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello there"}], max_tokens=max_tokens
    )


def _finished(n: int) -> Any:
    return lambda event: event["requests"] >= n and event["state"] == "idle"


def test_the_metrics_feed_of_a_streamed_server_shows_the_cache_and_the_reply(
    tiny_model_path: Any,
) -> None:
    model: Path = tiny_model_path("qwen3moe")
    with serving(model, "--moe-stream", "--cache-mb", "1", "-c", "1024") as s:
        replies: list[Any] = []
        base = s.url.removesuffix("/v1")
        # a reply long enough to outlast the feed's 0.1 s between events (24 tokens did not, once)
        seen = _metrics_until(f"{s.url}/bmoe/metrics", lambda: replies.append(_chat(s, 160)), _finished(1))
        first, last = seen[0], seen[-1]
        assert first["state"] == "idle" and first["request"] is None and first["streaming"]
        assert first["cache"]["resident_experts"] == 0
        assert first["cache"]["cells"] == ["0" * 8] * 4  # qwen3moe: 4 layers of 8 experts
        r = last["request"]
        assert (r["kind"], r["outcome"], r["tokens"]) == ("chat", "done", replies[0].usage.completion_tokens)
        assert r["prefill_done"] == r["prefill_total"] == replies[0].usage.prompt_tokens
        assert 0.0 <= r["hit_pct"] <= 100.0 and r["tok_s"] > 0
        assert r["read_mib_per_token"] > 0 and r["stall_ms_per_token"] >= 0
        cache = last["cache"]
        assert cache["budget_bytes"] == MIB and 0 < cache["resident_bytes"] <= MIB
        assert cache["layers"] == [0, 1, 2, 3] and cache["n_expert"] == 8
        cells = "".join(cache["cells"])
        assert sum(int(c, 16) & 1 for c in cells) == cache["resident_experts"] > 0
        assert max(int(c, 16) >> 1 for c in cells) > 0  # the reply's routing shows
        assert replies[0].usage.completion_tokens == 160
        assert any(e["state"] == "decode" for e in seen)
        # a second client connecting now sees the same cache, its heat not yet warm
        again = _metrics_until(f"{s.url}/bmoe/metrics", lambda: None, lambda e: True)[0]
        assert [int(c, 16) & 1 for c in "".join(again["cache"]["cells"])] == [int(c, 16) & 1 for c in cells]
        assert all(int(c, 16) >> 1 == 0 for c in "".join(again["cache"]["cells"]))
        page = httpx.get(f"{base}/", timeout=TIMEOUT)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/web/app.js">' in page.text
        for name, kind in [("app.js", "text/javascript"), ("app.css", "text/css")]:
            asset = httpx.get(f"{base}/web/{name}", timeout=TIMEOUT)
            assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        missing = httpx.get(f"{base}/web/nothing.js", timeout=TIMEOUT)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_resident_server_reports_its_rate_and_no_expert_cache(tiny_model_path: Any) -> None:
    with serving(tiny_model_path("qwen3moe"), "-c", "1024") as s:
        replies: list[Any] = []
        seen = _metrics_until(f"{s.url}/bmoe/metrics", lambda: replies.append(_chat(s, 16)), _finished(1))
        last = seen[-1]
        assert not last["streaming"] and last["cache"] is None
        r = last["request"]
        assert r["tokens"] == replies[0].usage.completion_tokens and r["tok_s"] > 0
        assert (r["hit_pct"], r["read_mib_per_token"], r["stall_ms_per_token"]) == (None, None, None)


def test_a_drafting_server_reports_its_drafts_in_the_feed_and_in_prometheus(tiny_model_path: Any) -> None:
    with serving(tiny_model_path("qwen3moe"), "--draft", "copy", "--metrics", "-c", "1024") as s:
        replies: list[Any] = []
        seen = _metrics_until(f"{s.url}/bmoe/metrics", lambda: replies.append(_chat(s, 160)), _finished(1))
        drafts = seen[-1]["request"]["drafts"]
        assert drafts is not None, "a greedy chat on a drafting server is drafted"
        # the fixture's greedy reply falls into a loop, which the drafter drafts as a loop
        assert drafts["verifies"] > 0 and drafts["accepted"] > 0, drafts
        assert drafts["tokens_per_verify"] == round(
            (drafts["accepted"] + drafts["verifies"]) / drafts["verifies"], 2
        )
        text = httpx.get(s.url.removesuffix("/v1") + "/metrics", timeout=TIMEOUT).text
        values = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
        assert float(values["bmoe:draft_verifies_total"]) == drafts["verifies"]
        assert float(values["bmoe:draft_tokens_total"]) == drafts["drafted"]
        assert float(values["bmoe:draft_tokens_accepted_total"]) == drafts["accepted"]
