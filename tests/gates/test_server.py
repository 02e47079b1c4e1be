"""The OpenAI-compatible server on the tiny models, driven by the official ``openai`` client.

Each test starts its own server in-process on a free local port (a session opens in
milliseconds on these models) and compares what the API answers with what a session opened
directly computes, or with what a fresh server answers. One test runs ``python -m
bmoe.serve`` as a subprocess.
"""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import httpx
import openai
import pytest
import uvicorn

from bmoe.domain.chat import ChatMessage
from bmoe.domain.decide import DecideRequest
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.runtime import Session, SessionConfig
from bmoe.serve.app import build_app
from bmoe.serve.flags import build_parser, http_options, session_config
from bmoe.serve.main import listen, open_served
from bmoe.serve.service import ServedSession
from bmoe.testing.fixtures import THINK_ANSWER, THINK_REASONING

TinyModelPath = Callable[..., Path]
TIMEOUT = 30.0
LONG = ["-c", "1024"]  # the tiny models' training context
SYSTEM = {"role": "system", "content": "Answer briefly."}
HELLO = {"role": "user", "content": "Hello there"}
REASONING = f"\n{THINK_REASONING}\n"  # the span between the think tags, as the session parses it


@attrs.frozen
class Running:
    url: str  # the API's base, ".../v1"
    served: ServedSession

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=TIMEOUT)


@contextlib.contextmanager
def serving(model: Path, *flags: str) -> Iterator[Running]:
    """A server on ``model`` with ``flags`` (``python -m bmoe.serve``'s), in this process."""
    args = build_parser().parse_args(["-m", str(model), *flags])
    served = open_served(args)
    sock = listen("127.0.0.1", 0)
    config = uvicorn.Config(
        build_app(served, http_options(args)), log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(3000):
            if server.started or not thread.is_alive():
                break
            time.sleep(0.01)
        assert server.started, "the server did not start"
        yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", served)
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        served.close(TIMEOUT)
        sock.close()


@contextlib.contextmanager
def direct(model: Path, *flags: str) -> Iterator[Session]:
    """A session opened directly, as the server with ``flags`` opens its own."""
    config: SessionConfig = session_config(build_parser().parse_args(["-m", str(model), *flags]), model)
    with Session.open(config) as session:
        yield session


def content(stream: Any) -> tuple[str, str, list[str]]:
    """A streamed chat's answer, reasoning and finish reasons."""
    text, reasoning, reasons = [], [], []
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return "".join(text), "".join(reasoning), reasons


def test_models_lists_the_one_served_model(tiny_model_path: TinyModelPath) -> None:
    with serving(tiny_model_path("qwen3moe"), "--alias", "tiny") as s:
        client = s.client()
        models = client.models.list().data
        assert [m.id for m in models] == ["tiny"]
        assert models[0].to_dict()["meta"]["arch"] == "qwen3moe"
        assert client.models.retrieve("tiny").id == "tiny"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("other")


def test_a_chat_answer_streamed_or_not_is_what_the_session_generates(tiny_model_path: TinyModelPath) -> None:
    model = tiny_model_path("qwen3moe")
    messages: Any = [SYSTEM, HELLO]
    with serving(model, *LONG) as s:
        client = s.client()
        whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12)
        chunks = list(
            client.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    with direct(model, *LONG) as session:
        ref = session.generate(
            GenerateRequest(HELLO["content"], n_predict=12, clear_kv=False),
            history=[ChatMessage("system", SYSTEM["content"])],
        )
    assert whole.choices[0].message.content == ref.text
    assert whole.choices[0].finish_reason == "length"
    usage = whole.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (ref.n_past - 12, 12)
    assert usage.total_tokens == ref.n_past
    assert chunks[0].choices[0].delta.role == "assistant"
    assert content(chunks) == (ref.text, "", ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


def test_a_thinking_model_answers_with_reasoning_content(tiny_model_path: TinyModelPath) -> None:
    messages: Any = [{"role": "user", "content": "Should I bring an umbrella?"}]
    with serving(tiny_model_path("qwen3moe-think")) as s:
        client = s.client()
        whole = client.chat.completions.create(model="t", messages=messages, max_tokens=32)
        streamed = content(
            client.chat.completions.create(model="t", messages=messages, max_tokens=32, stream=True)
        )
        off = client.chat.completions.create(
            model="t",
            messages=messages,
            max_tokens=32,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
    message = whole.choices[0].message
    assert (message.content, getattr(message, "reasoning_content", None)) == (THINK_ANSWER, REASONING)
    assert whole.choices[0].finish_reason == "stop"
    assert streamed == (THINK_ANSWER, REASONING, ["stop"])
    assert off.choices[0].message.content == THINK_ANSWER
    assert getattr(off.choices[0].message, "reasoning_content", None) is None


def test_a_text_completion_is_the_raw_prompt_continued(tiny_model_path: TinyModelPath) -> None:
    model = tiny_model_path("qwen3moe")
    prompt = "Once upon a time"
    with serving(model, *LONG) as s:
        client = s.client()
        whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=10)
        stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, stream=True)
        streamed = "".join(chunk.choices[0].text for chunk in stream)
    with direct(model, *LONG) as session:
        ref = session.generate(GenerateRequest(prompt, n_predict=10), chat=False)
    assert whole.choices[0].text == streamed == ref.text
    assert whole.usage is not None and whole.usage.prompt_tokens == ref.n_past - 10


def test_a_stop_string_stops_generating_and_cuts_the_text(tiny_model_path: TinyModelPath) -> None:
    messages: Any = [HELLO]
    with serving(tiny_model_path("qwen3moe"), *LONG) as s:
        client = s.client()
        full = (
            client.chat.completions.create(model="t", messages=messages, max_tokens=16)
            .choices[0]
            .message.content
        )
        assert full is not None and len(full) >= 8
        stop = full[4:7]
        expected = full[: full.find(stop)]
        cut = client.chat.completions.create(model="t", messages=messages, max_tokens=16, stop=[stop])
        streamed = content(
            client.chat.completions.create(
                model="t", messages=messages, max_tokens=16, stop=stop, stream=True
            )
        )
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == (expected, "stop")
    assert cut.usage is not None and cut.usage.completion_tokens < 16  # it stopped, not just cut
    assert streamed == (expected, "", ["stop"])


def test_the_same_seed_samples_the_same_text(tiny_model_path: TinyModelPath) -> None:
    messages: Any = [HELLO]
    with serving(tiny_model_path("qwen3moe"), *LONG) as s:
        client = s.client()

        def sample(seed: int) -> str | None:
            answer = client.chat.completions.create(
                model="t", messages=messages, max_tokens=16, temperature=1.0, seed=seed
            )
            return answer.choices[0].message.content

        first, again, other = sample(11), sample(11), sample(12)
    assert first == again
    assert first != other


def test_a_conversation_continued_reuses_the_kv_prefix_and_answers_as_a_fresh_server(
    tiny_model_path: TinyModelPath,
) -> None:
    model = tiny_model_path("qwen3moe")
    with serving(model, *LONG) as s, serving(model, *LONG) as fresh:
        client = s.client()
        first = client.chat.completions.create(model="t", messages=[SYSTEM, HELLO], max_tokens=8)
        reply = {"role": "assistant", "content": first.choices[0].message.content}
        turn2: Any = [SYSTEM, HELLO, reply, {"role": "user", "content": "And then?"}]
        second = client.chat.completions.create(model="t", messages=turn2, max_tokens=8)
        cold = fresh.client().chat.completions.create(model="t", messages=turn2, max_tokens=8)
    assert first.usage is not None and second.usage is not None and cold.usage is not None
    assert second.usage.prompt_tokens_details is not None and cold.usage.prompt_tokens_details is not None
    # the first turn's whole prompt (at least) was kept in memory, not prefilled again
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens == cold.usage.prompt_tokens
    assert second.choices[0].message.content == cold.choices[0].message.content


DECISION = {
    "prefix": "Task: turn on Wi-Fi. ",
    "suffix": "Options: A) Network B) Display. Answer with the letter.",
    "choices": ["A", "B"],
}


def test_decide_answers_what_the_session_decides(tiny_model_path: TinyModelPath) -> None:
    model = tiny_model_path("qwen3moe")
    with serving(model, "--decide") as s:
        first = httpx.post(f"{s.url}/decide", json=DECISION, timeout=TIMEOUT)
        again = httpx.post(f"{s.url}/decide", json=DECISION, timeout=TIMEOUT)
        typo = httpx.post(f"{s.url}/decide", json={**DECISION, "reuse": True}, timeout=TIMEOUT)
    with direct(model, "--decide") as session:
        ref = session.decide(
            DecideRequest(prefix=DECISION["prefix"], suffix=DECISION["suffix"], choices=("A", "B"))
        )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["object"] == "bmoe.decision" and body["choices"] == ["A", "B"]
    assert (body["best"], body["choice_logp"]) == (ref.best, list(ref.choice_logp))
    assert (body["n_tokens"], body["n_reused"]) == (ref.n_tokens, 0)
    assert sum(body["choice_p_renorm"]) == pytest.approx(1.0)
    kept = again.json()
    assert kept["n_reused"] > 0  # the prefix's state was kept and restored
    assert kept["choice_logp"] == pytest.approx(body["choice_logp"], abs=1e-4)
    assert typo.status_code == 400 and typo.json()["error"]["param"] == "reuse"
    with serving(model) as s:
        off = httpx.post(f"{s.url}/decide", json=DECISION, timeout=TIMEOUT)
    assert off.status_code == 400 and off.json()["error"]["code"] == "decide_disabled"


def test_errors_come_in_openais_shape_with_their_status(tiny_model_path: TinyModelPath) -> None:
    messages: Any = [HELLO]
    with serving(tiny_model_path("qwen3moe")) as s:  # a 512-token context
        client = s.client()
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as info:
                client.chat.completions.create(model="t", messages=messages, max_tokens=600, stream=stream)
            assert (info.value.status_code, info.value.code) == (400, "context_length_exceeded")
            assert "exceeds the context of 512 tokens" in info.value.message
        with pytest.raises(openai.BadRequestError) as unsupported:
            client.chat.completions.create(model="t", messages=messages, n=2)
        assert (unsupported.value.code, unsupported.value.param) == ("unsupported_parameter", "n")

        bad = httpx.post(f"{s.url}/chat/completions", json={"messages": messages, "temperature": "hot"})
        not_json = httpx.post(f"{s.url}/chat/completions", content=b"{nope")
        missing = httpx.get(f"{s.url}/nope")
        wrong_method = httpx.get(f"{s.url}/chat/completions")
        # the session is still fine after all that
        after = client.chat.completions.create(model="t", messages=messages, max_tokens=2)
    assert bad.status_code == 400
    assert bad.json() == {
        "error": {
            "message": "'temperature' must be a number, got string",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        }
    }
    assert not_json.status_code == 400
    assert not_json.json()["error"]["message"].startswith("the request body is not valid JSON")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405 and set(wrong_method.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert after.usage is not None and after.usage.completion_tokens == 2


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_client_that_goes_away_cancels_its_request(
    stream: bool, tiny_model_path: TinyModelPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn is held at its third token until a cancel reaches the session: without the
    cancel it would go on to 900 tokens, and the next request would wait for them."""
    model = tiny_model_path("qwen3moe")
    messages: Any = [SYSTEM, HELLO]
    results: list[RunResult] = []
    cancelled = threading.Event()
    with serving(model, *LONG) as s:
        session = s.served.session
        real_generate, real_cancel = session.generate, session.cancel

        def cancel() -> None:
            cancelled.set()
            real_cancel()

        def generate(
            request: GenerateRequest, on_progress: Any = None, on_begin: Any = None, **kw: Any
        ) -> RunResult:
            def progress(p: Any) -> None:
                on_progress(p)
                if p.step == 3:
                    cancelled.wait(TIMEOUT)  # hold this turn until a cancel arrives (or time out)

            result = real_generate(request, progress, on_begin, **kw)
            results.append(result)
            return result

        monkeypatch.setattr(session, "generate", generate)
        monkeypatch.setattr(session, "cancel", cancel)
        client = s.client()
        if stream:
            chunks = client.chat.completions.create(model="t", messages=messages, max_tokens=900, stream=True)
            next(iter(chunks))
            chunks.close()  # the client goes away
        else:
            body = {"messages": messages, "max_tokens": 900}
            with pytest.raises(httpx.ReadTimeout):  # the client gives up waiting and goes away
                httpx.post(f"{s.url}/chat/completions", json=body, timeout=httpx.Timeout(TIMEOUT, read=0.5))
        after = client.chat.completions.create(model="t", messages=messages, max_tokens=8, timeout=10)
    assert cancelled.is_set()
    assert results[0].cancelled and len(results[0].tokens) <= 3
    assert not results[1].cancelled
    with serving(model, *LONG) as fresh:
        cold = fresh.client().chat.completions.create(model="t", messages=messages, max_tokens=8)
    assert after.choices[0].message.content == cold.choices[0].message.content


def test_requests_run_one_at_a_time(tiny_model_path: TinyModelPath, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model_path("qwen3moe")
    lock = threading.Lock()
    counts = {"now": 0, "peak": 0}
    with serving(model, *LONG) as s:
        session = s.served.session
        real_generate = session.generate

        def generate(*args: Any, **kw: Any) -> RunResult:
            with lock:
                counts["now"] += 1
                counts["peak"] = max(counts["peak"], counts["now"])
            try:
                return real_generate(*args, **kw)
            finally:
                with lock:
                    counts["now"] -= 1

        monkeypatch.setattr(session, "generate", generate)
        client = s.client()

        def ask(i: int) -> str | None:
            messages: Any = [{"role": "user", "content": f"Question {i}"}]
            return (
                client.chat.completions.create(model="t", messages=messages, max_tokens=6)
                .choices[0]
                .message.content
            )

        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(ask, range(4)))
        one_by_one = [ask(i) for i in range(4)]
    assert counts["peak"] == 1
    assert together == one_by_one


def test_python_m_bmoe_serve_serves_until_interrupted(tiny_model_path: TinyModelPath) -> None:
    model = tiny_model_path("qwen3moe")
    cmd = [sys.executable, "-m", "bmoe.serve", "-m", str(model), "--port", "0", "--alias", "tiny"]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stderr or []:
            lines.put(line)
        lines.put(None)  # the process closed its stderr

    threading.Thread(target=read, daemon=True).start()
    try:
        url, seen = None, []
        while url is None:
            line = lines.get(timeout=120)
            assert line is not None, f"the server ended before serving: {''.join(seen)}"
            seen.append(line)
            found = re.search(r"serving 'tiny' on (http://\S+/v1)", line)
            url = found.group(1) if found else None
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=TIMEOUT)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        answer = client.chat.completions.create(model="tiny", messages=[HELLO], max_tokens=4)  # type: ignore[list-item]
        assert answer.usage is not None and answer.usage.completion_tokens == 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_dense_model_asked_to_stream_is_served_resident(tiny_model_path: TinyModelPath) -> None:
    """``--moe-stream`` on a model without routed experts: the server opens, says why in the
    session's notes, and answers what the resident model answers."""
    model = tiny_model_path("llama-dense")
    messages: Any = [HELLO]
    with serving(model, *LONG, "--moe-stream") as s:
        assert s.served.session.streaming is None
        assert any("no routed experts" in note for note in s.served.session.notes)
        streamed = s.client().chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    with serving(model, *LONG) as s:
        resident = s.client().chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    assert streamed.choices[0].message.content == resident.choices[0].message.content
