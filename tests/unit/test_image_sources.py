"""Image references followed to their bytes (no model): data URIs and base64 decoded here,
``http(s)://`` fetched only when the policy allows it (a local HTTP server stands in for the
web) and within its size and time, ``file://`` read only inside the media folder; each
refusal names the request's field. The server's flags that set the policy."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bmoe.adapters.image_sources import load_image
from bmoe.domain.media import Image
from bmoe.domain.media.references import (
    INLINE_MEDIA,
    InlineImage,
    LocalImage,
    MediaPolicy,
    RemoteImage,
    read_reference,
)
from bmoe.errors import ConfigError, RequestError
from bmoe.requests.api_requests import parse_chat_completion
from bmoe.serve.flags import HttpOptions, build_parser, http_options

PICTURE = bytes(range(256)) * 4  # 1 KiB: the bytes as sent, whatever they picture
B64 = base64.b64encode(PICTURE).decode()
AT = "messages[0].content[1].image_url"


def load(reference: object, policy: MediaPolicy = INLINE_MEDIA) -> bytes:
    return load_image(reference, AT, "messages[0].content[1]", policy).data


def refused(reference: object, policy: MediaPolicy = INLINE_MEDIA) -> RequestError:
    with pytest.raises(RequestError) as info:
        load(reference, policy)
    assert info.value.param == AT
    assert str(info.value).startswith(AT)
    return info.value


@pytest.mark.parametrize(
    "reference",
    [
        f"data:image/png;base64,{B64}",
        f"DATA:image/png;BASE64,{B64}",
        f"data:;base64,{B64}",
        f"data:application/octet-stream;base64,{B64}",
        B64,  # bare base64, as llama.cpp's server takes it
        f"  {B64}\n",
        "\n".join(B64[i : i + 76] for i in range(0, len(B64), 76)),  # MIME's line breaks
        base64.urlsafe_b64encode(PICTURE).decode().rstrip("="),  # URL-safe, unpadded
    ],
)
def test_inline_images_decode_to_their_bytes(reference: str) -> None:
    assert load(reference) == PICTURE


def test_an_image_keeps_the_name_of_its_part() -> None:
    image = load_image(B64, AT, "messages[0].content[1]", INLINE_MEDIA)
    assert image == Image(PICTURE)
    assert image.name == "messages[0].content[1]"


@pytest.mark.parametrize(
    ("reference", "says"),
    [
        ("not base64!", "not valid base64"),
        ("QUJD=QUJD", "not valid base64"),
        ("", "empty"),
        ("data:image/png;base64,", "empty"),
        ("data:image/png;base64", "needs a ','"),
        ("data:text/plain;base64,QUJD", "not an image"),
        ("ftp://example.com/a.png", "ftp: URLs are not supported"),
        ("https://example.com/a.png", "remote image URLs are off"),
        ("file:///tmp/a.png", "file:// images are off (start the server with --media-path DIR"),
        (None, "must be a string"),
        ({"url": B64}, "must be a string"),
    ],
)
def test_what_is_not_an_image_reference_is_refused_by_name(reference: object, says: str) -> None:
    assert says in str(refused(reference))


def test_references_read_as_the_policy_allows() -> None:
    remote = MediaPolicy(allow_remote=True)
    folder = MediaPolicy(media_path=Path("/srv/media"))
    assert read_reference("https://x.org/a.png", AT, remote) == RemoteImage("https://x.org/a.png")
    assert read_reference("file:///srv/media/a%20b.png", AT, folder) == LocalImage(Path("/srv/media/a b.png"))
    assert read_reference("file://localhost/srv/media/a.png", AT, folder) == LocalImage(
        Path("/srv/media/a.png")
    )
    assert read_reference("data:image/gif,GIF89a%01", AT, INLINE_MEDIA) == InlineImage(b"GIF89a\x01")
    with pytest.raises(RequestError, match="names no host"):
        read_reference("file://other/srv/media/a.png", AT, folder)
    assert not INLINE_MEDIA.reaches_out and remote.reaches_out and folder.reaches_out
    with pytest.raises(ValueError):
        MediaPolicy(media_path=Path("relative"))


class Pictures(BaseHTTPRequestHandler):
    """``/pic``: the picture; ``/big``: over the limit, said in Content-Length; ``/unsized``:
    over the limit, no length said; ``/gone``: 404; ``/away``: a redirect to ``/pic``."""

    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        if self.path == "/pic":
            self._send(200, PICTURE)
        elif self.path == "/big":
            self._send(200, b"x" * 5000)
        elif self.path == "/unsized":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 5000)
        elif self.path == "/away":
            self.send_response(302)
            self.send_header("Location", "/pic")
            self.end_headers()
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def web() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_remote_images_are_fetched_when_allowed_within_the_size_limit(web: str) -> None:
    policy = MediaPolicy(allow_remote=True, allow_private=True, max_bytes=2048, timeout_s=5.0)
    assert load(f"{web}/pic", policy) == PICTURE
    assert load(f"{web}/away", policy) == PICTURE
    assert "over the 2048 bytes allowed" in str(refused(f"{web}/big", policy))
    assert "over the 2048 bytes allowed" in str(refused(f"{web}/unsized", policy))
    assert "answered 404" in str(refused(f"{web}/gone", policy))
    assert "remote image URLs are off" in str(refused(f"{web}/pic"))


def test_a_remote_image_that_cannot_be_reached_is_refused_by_name() -> None:
    policy = MediaPolicy(allow_remote=True, allow_private=True, timeout_s=2.0)
    assert "could not be fetched" in str(refused("http://127.0.0.1:9/a.png", policy))


def test_a_chat_request_fetches_its_image_under_the_server_s_policy(web: str) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": f"{web}/pic"}]}]}
    asked = parse_chat_completion(body, MediaPolicy(allow_remote=True, allow_private=True))
    assert asked.messages[0].images == (Image(PICTURE),)


@pytest.fixture
def media(tmp_path: Path) -> MediaPolicy:
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "cat.png").write_bytes(PICTURE)
    (root / "empty.png").write_bytes(b"")
    (tmp_path / "secret.png").write_bytes(b"outside")
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    (root / "inner.png").symlink_to(root / "sub" / "cat.png")
    return MediaPolicy(media_path=root.resolve(), max_bytes=4096)


def test_local_images_are_read_inside_the_media_folder_only(media: MediaPolicy) -> None:
    root = media.media_path
    assert root is not None
    assert load(f"file://{root}/sub/cat.png", media) == PICTURE
    assert load(f"file://{root}/inner.png", media) == PICTURE  # a link that stays inside
    assert load(f"file://{root}/sub/../sub/cat.png", media) == PICTURE
    for escaping in (
        f"file://{root}/../secret.png",  # .. out of the folder
        f"file://{root}/link.png",  # a link out of it
        f"file://{root.parent}/secret.png",
        f"file://{root}/missing.png",
        f"file://{root}/sub",  # a folder
    ):
        assert "no such file in the media folder" in str(refused(escaping, media))
    assert "empty" in str(refused(f"file://{root}/empty.png", media))
    small = MediaPolicy(media_path=root, max_bytes=100)
    assert "over the 100 bytes allowed" in str(refused(f"file://{root}/sub/cat.png", small))
    assert "file:// images are off" in str(refused(f"file://{root}/sub/cat.png"))


def test_the_server_s_flags_set_where_images_may_come_from(tmp_path: Path) -> None:
    assert http_options(build_parser().parse_args([])) == HttpOptions()
    args = build_parser().parse_args(["--media-path", str(tmp_path / "."), "--allow-remote-media"])
    assert http_options(args) == HttpOptions(media_path=tmp_path.resolve(), allow_remote_media=True)
    both = build_parser().parse_args(["--allow-remote-media", "--allow-private-media"])
    assert http_options(both) == HttpOptions(allow_remote_media=True, allow_private_media=True)
    with pytest.raises(ConfigError, match="--allow-private-media needs --allow-remote-media"):
        http_options(build_parser().parse_args(["--allow-private-media"]))
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "missing", tmp_path / "file"):
        with pytest.raises(ConfigError, match="--media-path"):
            http_options(build_parser().parse_args(["--media-path", str(bad)]))


def test_the_server_s_routes_read_images_under_its_policy(web: str, tmp_path: Path) -> None:
    """Each API's route refuses a remote image by default; with ``--allow-remote-media``
    refuses one on this machine (a loopback address); with ``--allow-private-media`` too
    reads it (off the event loop) before the session is asked."""
    from starlette.testclient import TestClient
    from test_serve_service import served

    from bmoe.serve.app import build_app

    image = {"type": "image_url", "image_url": f"{web}/gone"}
    bodies = {
        "/v1/chat/completions": ({"messages": [{"role": "user", "content": [image]}]}, "image_url"),
        "/v1/responses": (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": f"{web}/gone"}]}]},
            "image_url",
        ),
        "/v1/messages": (
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": f"{web}/gone"}}],
                    }
                ],
            },
            "source.url",
        ),
    }
    for options, says in (
        (HttpOptions(), "remote image URLs are off"),
        (HttpOptions(allow_remote_media=True), "a loopback address: refused"),
        (HttpOptions(allow_remote_media=True, allow_private_media=True), "404"),
    ):
        s, fake = served("x")
        fake.model = None  # type: ignore[attr-defined]  # the tokenizer's routes are not asked
        try:
            with TestClient(build_app(s, options)) as client:
                for path, (body, field) in bodies.items():
                    answer = client.post(path, json=body)
                    assert answer.status_code == 400, (path, answer.text)
                    error = answer.json()["error"]
                    assert says in error["message"], (path, error)
                    assert field in error["message"], (path, error)
        finally:
            s.close(5.0)
