"""Images as clients send them (issue 64), through the server on the M-RoPE vision fixture:
PNG, JPEG, GIF (still and animated), WebP (lossy, lossless, animated) and a JPEG taken
sideways (EXIF orientation 6), each sent as chat completions' ``image_url``, as a
Messages ``image`` block inside a ``tool_result`` (a coding agent's screenshot) and as a
Responses ``input_image``: every one answered, the three APIs giving one answer, and the
streamed server (``--moe-stream --cache-mb 1``) the resident one's, bit for bit.

And the pictures' identity: a lossless WebP is the PNG of the same pixels (one answer), an
animated picture is its first frame, and a PNG whose EXIF says "turned" is the upright
picture."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from test_server import Running, serving  # the in-process server of test_server.py
from test_server_images import FLAGS

from bmoe.adapters.llama import vision as vision_adapter
from bmoe.adapters.picture_pixels import ORIENTATION
from bmoe.testing.fixtures.vision import vision_fixture

pytestmark = pytest.mark.skipif(
    not vision_adapter.available(), reason="llama-cpp-python built without libmtmd"
)

N = 8
QUESTION = "What is in this picture?"


def drawn(seed: int, size: tuple[int, int] = (48, 32)) -> Image.Image:
    """A picture with some structure (a gradient and random blocks), RGB."""
    rng = np.random.default_rng(seed)
    w, h = size
    ramp = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] * np.ones((h, 1, 3), np.float32)
    blocks = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3)).repeat(8, 0).repeat(8, 1)[:h, :w]
    return Image.fromarray(((ramp + blocks) / 2).astype(np.uint8), "RGB")


def saved(picture: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    picture.save(out, fmt, **options)
    return out.getvalue()


def exif(orientation: int) -> bytes:
    tags = Image.Exif()
    tags[ORIENTATION] = orientation
    return tags.tobytes()


FRAMES = [drawn(11), drawn(12), drawn(13)]
UPRIGHT = drawn(14, (32, 48))
PICTURES: dict[str, tuple[bytes, str]] = {  # name: (bytes, the media type a client says)
    "png": (saved(drawn(1), "PNG"), "image/png"),
    "png_alpha": (saved(drawn(2).convert("RGBA"), "PNG"), "image/png"),
    "jpeg": (saved(drawn(3), "JPEG", quality=90), "image/jpeg"),
    "gif": (saved(drawn(4), "GIF"), "image/gif"),
    "gif_animated": (
        saved(FRAMES[0], "GIF", save_all=True, append_images=FRAMES[1:], duration=80, loop=0),
        "image/gif",
    ),
    "webp_lossy": (saved(drawn(5), "WEBP", quality=75), "image/webp"),
    "webp_lossless": (saved(drawn(1), "WEBP", lossless=True), "image/webp"),  # png's pixels
    "webp_animated": (
        saved(FRAMES[0], "WEBP", save_all=True, append_images=FRAMES[1:], duration=80, lossless=True),
        "image/webp",
    ),
    "first_frame_png": (saved(FRAMES[0], "PNG"), "image/png"),
    "jpeg_sideways": (
        saved(UPRIGHT.transpose(Image.Transpose.ROTATE_90), "JPEG", exif=exif(6)),
        "image/jpeg",
    ),
    "png_sideways": (saved(UPRIGHT.transpose(Image.Transpose.ROTATE_90), "PNG", exif=exif(6)), "image/png"),
    "png_upright": (saved(UPRIGHT, "PNG"), "image/png"),
}
APIS = ("chat", "messages_tool_result", "responses")


def body(api: str, data: bytes, media_type: str) -> tuple[str, dict[str, Any]]:
    """The route and body that send ``data`` through ``api``, greedy, ``N`` tokens."""
    b64 = base64.b64encode(data).decode()
    uri = f"data:{media_type};base64,{b64}"
    if api == "chat":
        parts = [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": QUESTION}]
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": parts}],
            "max_tokens": N,
            "temperature": 0,
        }
    if api == "responses":
        parts = [{"type": "input_image", "image_url": uri}, {"type": "input_text", "text": QUESTION}]
        return "/v1/responses", {
            "input": [{"role": "user", "content": parts}],
            "max_output_tokens": N,
            "temperature": 0,
            "store": False,
        }
    image = {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64}}
    return "/v1/messages", {
        "max_tokens": N,
        "temperature": 0,
        "tools": [{"name": "screenshot", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]}]},
        ],
    }


def text_of(api: str, reply: dict[str, Any]) -> str:
    if api == "chat":
        return str(reply["choices"][0]["message"]["content"])
    if api == "responses":
        return "".join(
            part["text"] for item in reply["output"] if item["type"] == "message" for part in item["content"]
        )
    return "".join(block.get("text", "") for block in reply["content"])


def answers(running: Running) -> dict[tuple[str, str], str]:
    """Every picture through every API: the answer's text, each request answered 200."""
    root = running.url.removesuffix("/v1")
    out: dict[tuple[str, str], str] = {}
    with httpx.Client(timeout=120) as http:
        for name, (data, media_type) in PICTURES.items():
            for api in APIS:
                path, sent = body(api, data, media_type)
                reply = http.post(root + path, json=sent)
                assert reply.status_code == 200, (name, api, reply.text)
                out[name, api] = text_of(api, reply.json())
    return out


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, dict[tuple[str, str], str]]]:
    fx = vision_fixture("qwen3vl")
    found: dict[str, dict[tuple[str, str], str]] = {}
    with serving(fx.model, "--mmproj", str(fx.mmproj), *FLAGS) as running:
        found["resident"] = answers(running)
    with serving(fx.model, "--mmproj", str(fx.mmproj), *FLAGS, "--moe-stream", "--cache-mb", "1") as running:
        assert running.served.session.streaming is not None, running.served.session.notes
        found["streamed"] = answers(running)
    yield found


def test_every_format_is_answered_streamed_as_resident(served: dict[str, dict[tuple[str, str], str]]) -> None:
    assert served["streamed"] == served["resident"]
    assert all(text for text in served["resident"].values())


def test_the_three_apis_give_one_answer_but_messages_own_prompt(
    served: dict[str, dict[tuple[str, str], str]],
) -> None:
    """Chat completions and Responses send the same prompt (one user message); a Messages
    tool result is another prompt, answered on its own (its equality is the streamed one)."""
    got = served["resident"]
    for name in PICTURES:
        assert got[name, "chat"] == got[name, "responses"], name


def test_a_picture_is_its_pixels_whatever_carries_them(served: dict[str, dict[tuple[str, str], str]]) -> None:
    got = served["resident"]
    for api in APIS:
        assert got["webp_lossless", api] == got["png", api]  # one picture, two lossless formats
        assert got["webp_animated", api] == got["first_frame_png", api]  # the first frame
        assert got["png_sideways", api] == got["png_upright", api]  # EXIF orientation applied
    assert len({got[name, "chat"] for name in ("png", "jpeg", "gif", "webp_lossy", "gif_animated")}) > 1
