"""The HTTP side's guards (no model): the API key flags and check, the body limit, and the
Prometheus text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bmoe.domain.drafting import DraftReport
from bmoe.domain.generation import Progress, RunResult
from bmoe.errors import ConfigError
from bmoe.serve.errors import BodyTooLargeError
from bmoe.serve.flags import HttpOptions, build_parser, http_options
from bmoe.serve.guards import MIB, Guards, default_max_body, key_matches, presented_keys
from bmoe.serve.prometheus import ServedTotals, prometheus_text


def test_keys_come_from_the_flags_and_the_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# ops\n  alpha \n\nbeta\n")
    args = build_parser().parse_args(["--api-key", "k1", "--api-key", "k2", "--api-key-file", str(keys)])
    assert http_options(args) == HttpOptions(api_keys=("k1", "k2", "alpha", "beta"))
    assert http_options(build_parser().parse_args([])) == HttpOptions()
    empty = tmp_path / "empty"
    empty.write_text("# none\n")
    for flags in (
        ["--api-key-file", str(empty)],
        ["--api-key", " "],
        ["--api-key-file", str(tmp_path / "no")],
    ):
        with pytest.raises(ConfigError):
            http_options(build_parser().parse_args(flags))
    with pytest.raises(ConfigError):
        http_options(build_parser().parse_args(["--max-body-mb", "0"]))


def test_a_key_is_read_from_either_header_and_matched_exactly() -> None:
    headers = [(b"Authorization", b"Bearer  k1 "), (b"X-Api-Key", b"k2"), (b"authorization", b"Basic xx")]
    assert presented_keys(headers) == ["k1", "k2"]
    assert key_matches("k1", ["k0", "k1"]) and not key_matches("k", ["k1"]) and not key_matches("", ["k1"])


def test_the_body_limit_follows_the_context_with_a_floor() -> None:
    assert default_max_body(512) == 8 * MIB
    assert default_max_body(1 << 20) == 32 * MIB


def _call(app: Guards, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> tuple[int, Any]:
    sent: list[dict[str, Any]] = []
    reached: list[bytes] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        reached.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    app.app = inner

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": headers}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"]) if sent[0]["status"] != 200 else reached


def test_guards_answer_401_and_413_in_the_routes_dialect() -> None:
    app = Guards(lambda *_: None, api_keys=("k1",), max_body=10)  # type: ignore[arg-type,return-value]
    status, body = _call(app, "/v1/messages", [])
    assert (status, body["error"]["type"]) == (401, "authentication_error")
    status, body = _call(app, "/v1/chat/completions", [(b"authorization", b"Bearer nope")])
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    assert _call(app, "/health", [])[0] == 200 and _call(app, "/web/app.js", [])[0] == 200
    status, body = _call(app, "/v1/models", [(b"x-api-key", b"k1"), (b"content-length", b"11")], b"x" * 11)
    assert (status, body["error"]["code"]) == (413, "request_too_large")
    status, reached = _call(app, "/v1/models", [(b"x-api-key", b"k1")], b"x" * 10)
    assert (status, reached) == (200, [b"x" * 10])
    with pytest.raises(BodyTooLargeError):  # no length said: the read past the limit fails
        _call(app, "/v1/models", [(b"x-api-key", b"k1")], b"x" * 11)
    with pytest.raises(ValueError):
        Guards(lambda *_: None, api_keys=("",))  # type: ignore[arg-type,return-value]


def test_prometheus_text_sums_what_the_server_computed() -> None:
    totals = ServedTotals()
    totals.token(Progress(1, 4, 1.0, "a", ""))
    result = RunResult("ab", "", (1, 2), n_prompt=7, n_past=9, prefill_s=0.5, decode_s=0.25)
    totals.finished(result)
    text = prometheus_text(totals, processing=1, deferred=2, streaming=False)
    values = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
    assert float(values["llamacpp:prompt_tokens_total"]) == 7
    assert float(values["llamacpp:tokens_predicted_total"]) == 2
    assert float(values["llamacpp:predicted_tokens_seconds"]) == 8
    assert (values["llamacpp:requests_processing"], values["llamacpp:requests_deferred"]) == ("1", "2")
    assert "# TYPE llamacpp:prompt_tokens_total counter" in text
    assert "bmoe:expert_cache_hit_ratio" not in text
    assert "bmoe:expert_cache_hit_ratio" in prometheus_text(totals, 0, 0, streaming=True)


def test_prometheus_text_counts_copy_drafts_where_the_server_drafts() -> None:
    totals = ServedTotals()
    drafted = DraftReport(verifies=3, drafted=40, accepted=30)
    for drafts in (drafted, None, drafted):  # None: a request that was not drafted
        totals.finished(RunResult("ab", "", (1, 2), 7, 9, 0.5, 0.25, drafts=drafts))
    assert "bmoe:draft" not in prometheus_text(totals, 0, 0, streaming=True)
    text = prometheus_text(totals, 0, 0, streaming=True, drafting=True)
    values = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
    assert values["bmoe:draft_verifies_total"] == "6"
    assert values["bmoe:draft_tokens_total"] == "80"
    assert values["bmoe:draft_tokens_accepted_total"] == "60"
    assert "# TYPE bmoe:draft_tokens_accepted_total counter" in text
