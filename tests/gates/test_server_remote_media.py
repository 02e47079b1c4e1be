"""``--allow-remote-media`` fetches nothing it should not (issue 64), through the server on
the vision fixture: image URLs at 127.0.0.1 (a picture server on this machine), 10.0.0.1,
169.254.169.254 (the cloud metadata service), ``[::1]`` and ``localhost`` are each a 400
naming the address, in all three APIs, before anything is connected to (the picture server
is never asked); with ``--allow-private-media`` too, the picture server's picture is fetched
and answered as the same picture sent inline."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest
from test_image_gates import PICTURE_A
from test_server import Running, serving
from test_server_images import FLAGS

from bmoe.adapters.llama import vision as vision_adapter
from bmoe.testing.fixtures.vision import vision_fixture

pytestmark = pytest.mark.skipif(
    not vision_adapter.available(), reason="llama-cpp-python built without libmtmd"
)

N = 6


class Pictures(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PICTURE_A)))
        self.end_headers()
        self.wfile.write(PICTURE_A)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def pictures() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def bodies(url: str) -> dict[str, dict[str, Any]]:
    """One request per API placing the image at ``url``."""
    return {
        "/v1/chat/completions": {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": "What is it?"},
                    ],
                }
            ],
            "max_tokens": N,
            "temperature": 0,
        },
        "/v1/responses": {
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}],
            "max_output_tokens": N,
            "temperature": 0,
            "store": False,
        },
        "/v1/messages": {
            "max_tokens": N,
            "temperature": 0,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]}
            ],
        },
    }


def post(running: Running, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(running.url.removesuffix("/v1") + path, json=body, timeout=60)


def error_text(reply: httpx.Response) -> str:
    return str(reply.json()["error"]["message"])


def chat(url: str) -> dict[str, Any]:
    return bodies(url)["/v1/chat/completions"]


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("127.0.0.1:{port}", "127.0.0.1, a loopback address"),
        ("10.0.0.1", "10.0.0.1, a private address"),
        ("169.254.169.254", "169.254.169.254, a link-local address"),
        ("[::1]:{port}", "::1, a loopback address"),
        ("localhost:{port}", "localhost ("),
    ],
)
def test_a_private_address_is_refused_by_name_in_every_api(pictures: int, host: str, says: str) -> None:
    fx = vision_fixture("qwen3vl")
    url = f"http://{host.format(port=pictures)}/cat.png"
    Pictures.asked.clear()
    with serving(fx.model, "--mmproj", str(fx.mmproj), *FLAGS, "--allow-remote-media") as running:
        for path, body in bodies(url).items():
            reply = post(running, path, body)
            assert reply.status_code == 400, (path, reply.text)
            assert says in error_text(reply) and "--allow-private-media" in error_text(reply), reply.text
    assert Pictures.asked == []  # refused before connecting


def test_the_picture_server_is_fetched_only_with_private_addresses_allowed(pictures: int) -> None:
    fx = vision_fixture("qwen3vl")
    url = f"http://127.0.0.1:{pictures}/cat.png"
    inline = f"data:image/png;base64,{base64.b64encode(PICTURE_A).decode()}"
    Pictures.asked.clear()
    flags = ("--mmproj", str(fx.mmproj), *FLAGS, "--allow-remote-media", "--allow-private-media")
    with serving(fx.model, *flags) as running:
        fetched = post(running, "/v1/chat/completions", chat(url))
        assert fetched.status_code == 200, fetched.text
        sent = post(running, "/v1/chat/completions", chat(inline))
    assert Pictures.asked == ["/cat.png"]
    assert fetched.json()["choices"][0]["message"] == sent.json()["choices"][0]["message"]
