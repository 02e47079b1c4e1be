"""What every request passes (the API key, the body limit) and llama.cpp's service endpoints
(``/health``, ``/tokenize``, ``/detokenize``, ``/props``, ``/slots``, ``/metrics``), on the
tiny fixture with the real clients."""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from test_server import LONG, serving  # the in-process server of test_server.py

TinyModelPath = Callable[..., Path]
TIMEOUT = 30.0
HELLO: Any = [{"role": "user", "content": "Hello there"}]
MIB = 1 << 20


def test_with_keys_every_route_but_health_needs_one_in_either_header(
    tiny_model_path: TinyModelPath, tmp_path: Path
) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# the team's keys\nfile-key\n\n")
    flags = ("--api-key", "k1", "--api-key-file", str(key_file))
    with serving(tiny_model_path("qwen3moe"), *flags) as s:
        base = s.url.removesuffix("/v1")

        def oai(key: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=s.url, api_key=key, max_retries=0, timeout=TIMEOUT)

        def claude(key: str) -> anthropic.Anthropic:
            return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=TIMEOUT)

        with pytest.raises(openai.AuthenticationError) as wrong:
            oai("nope").chat.completions.create(model="t", messages=HELLO, max_tokens=2)
        assert wrong.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            oai("nope").responses.create(model="t", input="Hi", max_output_tokens=2)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            claude("k1x").messages.create(model="t", messages=HELLO, max_tokens=2)
        assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        assert oai("k1").chat.completions.create(model="t", messages=HELLO, max_tokens=2).usage is not None
        assert (
            oai("file-key").responses.create(model="t", input="Hi", max_output_tokens=2).output_text
            is not None
        )
        assert claude("k1").messages.create(model="t", messages=HELLO, max_tokens=2).usage.output_tokens == 2
        assert httpx.get(f"{base}/health").json() == {"status": "ok"}
        assert httpx.get(f"{base}/").status_code == 200  # the page itself; its requests need the key
        missing = httpx.get(f"{s.url}/models")
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        assert httpx.post(f"{base}/tokenize", json={"content": "x"}).status_code == 401
        keyed = httpx.post(f"{base}/tokenize", json={"content": "x"}, headers={"x-api-key": "file-key"})
        assert keyed.status_code == 200


def _raw_post(port: int, path: str, head: bytes, chunks: Any) -> tuple[bytes, int]:
    """Send a request by hand (headers ``head``, then ``chunks`` until the server answers);
    the status line and how many bytes of the body were sent before the answer came."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30.0) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode() + head)
        answer = b""
        for chunk in chunks:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break  # the server answered (or closed): no more to send
            try:
                sock.sendall(chunk)  # blocks while the server does not read
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n" not in answer:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
    return answer.split(b"\r\n")[0], sent


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def test_a_body_past_the_limit_is_answered_413_without_being_read_whole(
    tiny_model_path: TinyModelPath,
) -> None:
    with serving(tiny_model_path("qwen3moe"), *LONG) as s:
        port = int(s.url.split(":")[2].split("/")[0])
        before = _rss()
        # 100 MiB announced: refused on its Content-Length, the body never read
        status, sent = _raw_post(
            port, "/v1/chat/completions", b"Content-Length: 104857600\r\n\r\n", [b"{" * MIB]
        )
        assert status == b"HTTP/1.1 413 Request Entity Too Large" and sent <= MIB  # 1 of 100 MiB
        # chunked, no length: refused once what arrived passes the limit (8 MiB here)
        chunk = b"%x\r\n%s\r\n" % (MIB, b" " * MIB)
        status, sent = _raw_post(port, "/v1/messages", b"Transfer-Encoding: chunked\r\n\r\n", [chunk] * 100)
        assert status.startswith(b"HTTP/1.1 413") and sent < 100 * len(chunk)  # answered before the end
        assert _rss() - before < 50 * MIB
        body = httpx.post(
            f"{s.url}/messages", content=b" " * (9 * MIB), headers={"content-type": "application/json"}
        )
        assert body.status_code == 413 and body.json()["error"]["type"] == "request_too_large"
        # the server answers as before, and other clients while a big body is still arriving
        answer = s.client().chat.completions.create(model="t", messages=HELLO, max_tokens=2)
        assert answer.usage is not None and answer.usage.completion_tokens == 2
        with socket.create_connection(("127.0.0.1", port), timeout=30.0) as held:
            held.sendall(
                b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunk
            )  # 1 MiB of a body that never ends
            meanwhile = s.client().chat.completions.create(model="t", messages=HELLO, max_tokens=2)
            assert meanwhile.usage is not None and meanwhile.usage.completion_tokens == 2
    with serving(tiny_model_path("qwen3moe"), "--max-body-mb", "0.01") as small:
        big = httpx.post(f"{small.url}/chat/completions", json={"messages": HELLO, "pad": "x" * 20000})
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def test_llamacpps_service_endpoints(tiny_model_path: TinyModelPath) -> None:
    with serving(tiny_model_path("qwen3moe"), *LONG, "--metrics") as s:
        base = s.url.removesuffix("/v1")
        tokens = httpx.post(f"{base}/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert tokens and all(isinstance(t, int) for t in tokens)
        pieces = httpx.post(f"{base}/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
        assert [p["id"] for p in pieces["tokens"]] == tokens
        text = httpx.post(f"{base}/detokenize", json={"tokens": tokens}).json()["content"]
        assert text.strip() == "Hello world"
        bad = httpx.post(f"{base}/detokenize", json={"tokens": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[0]"
        props = httpx.get(f"{base}/props").json()
        assert (props["n_ctx"], props["total_slots"]) == (1024, 1) and props["chat_template"]
        answer = s.client().chat.completions.create(model="t", messages=HELLO, max_tokens=5)
        slots = httpx.get(f"{base}/slots").json()
        assert slots[0]["is_processing"] is False
        assert answer.usage is not None and slots[0]["tokens_cached"] == answer.usage.total_tokens - 1
        metrics = httpx.get(f"{base}/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        values = dict(line.split(" ") for line in metrics.text.splitlines() if not line.startswith("#"))
        assert float(values["llamacpp:tokens_predicted_total"]) == 5
        assert float(values["llamacpp:prompt_tokens_total"]) == answer.usage.prompt_tokens
        assert float(values["llamacpp:requests_processing"]) == 0
    with serving(tiny_model_path("qwen3moe"), "--moe-stream", "--cache-mb", "1") as streamed:
        base = streamed.url.removesuffix("/v1")
        assert httpx.get(f"{base}/metrics").status_code == 404  # not without --metrics
        assert httpx.get(f"{base}/health").status_code == 200
        plan = httpx.get(f"{base}/props", timeout=60).json()["plan"]  # python -m bmoe.plan's figures
        assert plan["model"]["arch"] == "qwen3moe" and plan["streamed"]["cache_bytes"] == 1 << 20
        assert plan["streamed"]["decode_bound"] in ("disk", "compute") and "--cache-mb" in plan["flags"]


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(
    tiny_model_path: TinyModelPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(tiny_model_path("qwen3moe")) as s:  # a 512-token context
        longest = s.served.longest_token_bytes
        assert longest > 0
        engine = s.served.session.engine
        renders: list[int] = []
        real_render = engine.render_prompt

        def render_prompt(*args: Any, **kw: Any) -> list[int]:
            renders.append(1)
            return real_render(*args, **kw)

        monkeypatch.setattr(engine, "render_prompt", render_prompt)
        huge: Any = [{"role": "user", "content": "x" * (512 * longest + 1)}]
        with pytest.raises(openai.BadRequestError) as info:
            s.client().chat.completions.create(model="t", messages=huge, max_tokens=2)
        assert info.value.code == "context_length_exceeded" and "before tokenizing" in info.value.message
        claude = anthropic.Anthropic(base_url=s.url.removesuffix("/v1"), api_key="x", max_retries=0)
        with pytest.raises(anthropic.BadRequestError):
            claude.messages.count_tokens(model="t", messages=huge)
        assert not renders  # never tokenized
        fits = s.client().chat.completions.create(model="t", messages=HELLO, max_tokens=2)
    assert fits.usage is not None and renders
