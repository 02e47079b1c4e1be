"""Images as rows of ids and the positions they take (``bmoe.domain.media``), and the
session engine with images on the scripted backend."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from bmoe.domain.generation import GenerateRequest
from bmoe.domain.media import MEDIA_MARKER, Image, ImageRows, image_row_ids, is_image_row
from bmoe.domain.media.positions import PositionLedger
from bmoe.errors import ConfigError, ImageError
from bmoe.service.session_engine import EngineDefaults, SessionEngine
from bmoe.testing.fake_backend import IMAGE_ROWS, ScriptedGenerateBackend


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def test_row_ids_are_negative_int32_named_by_the_pixels() -> None:
    a, b = image_row_ids(_digest("a"), 20), image_row_ids(_digest("b"), 20)
    assert all(is_image_row(t) and t >= -(2**31) for t in a)
    assert np.asarray(a, dtype="<i4").tolist() == list(a)  # what the disk tier keeps
    assert a == image_row_ids(_digest("a"), 20) and a != b
    assert a[:8] != b[:8]  # told apart by its first rows already
    assert a[8:16] == a[:8]  # the digest's chunks repeat


def test_an_image_cannot_take_more_positions_than_rows() -> None:
    with pytest.raises(ValueError):
        ImageRows(image_row_ids(_digest("a"), 4), n_pos=5)


def test_ledger_positions_follow_mrope_images() -> None:
    ledger = PositionLedger()
    rows = ImageRows(image_row_ids(_digest("a"), 16), n_pos=4)  # a 4x4 grid
    assert ledger.add(3, rows) == 3  # three text tokens, then the image at position 3
    assert ledger.position(3) == 3
    assert ledger.position(19) == 7  # the token after it: 3 + 4
    assert ledger.position(25) == 13
    assert ledger.splits_image(10) and not ledger.splits_image(19) and not ledger.splits_image(3)
    assert ledger.cut(10) is None and len(ledger.images) == 1  # refused, unchanged
    restored = PositionLedger.from_bytes(ledger.to_bytes())
    assert restored == ledger
    assert ledger.cut(21) == 9 and len(ledger.images) == 1
    assert ledger.cut(3) == 3 and not ledger.images


def test_ledger_with_1d_images_is_the_identity() -> None:
    ledger = PositionLedger()
    ledger.add(2, ImageRows(image_row_ids(_digest("a"), 5), n_pos=5))
    assert [ledger.position(i) for i in range(10)] == list(range(10))


def test_a_request_places_one_marker_per_image() -> None:
    with pytest.raises(ConfigError, match="places 0 images"):
        GenerateRequest(prompt="no marker", images=(Image(b"x"),))
    GenerateRequest(prompt=f"{MEDIA_MARKER} one", images=(Image(b"x"),))
    GenerateRequest(prompt=f"text with a literal {MEDIA_MARKER} and no images")


def _engine() -> tuple[SessionEngine, ScriptedGenerateBackend]:
    backend = ScriptedGenerateBackend(n_ctx=512)
    return SessionEngine(backend, renderer=_Plain(), defaults=EngineDefaults(n_predict=4)), backend


class _Plain:
    tool_format = None

    def render(self, messages, *, add_generation_prompt=True, enable_thinking=True, tools=None):  # type: ignore[no-untyped-def]
        return "".join(f"<{m.role}>{m.content}" for m in messages) + "<assistant>"


def test_the_engine_feeds_image_rows_and_reuses_them_as_a_prefix() -> None:
    engine, _ = _engine()
    pic = Image(b"\x89PNG fake picture", name="messages[0].content[0]")
    first = engine.generate(GenerateRequest(f"{MEDIA_MARKER}what is it?", images=(pic,)), chat=True)
    assert sum(is_image_row(t) for t in engine.kv_tokens) == IMAGE_ROWS
    again = engine.generate(GenerateRequest("and then?", clear_kv=False), chat=True)
    assert again.n_prompt < len(engine.kv_tokens) - IMAGE_ROWS  # the image stayed in the KV
    other = Image(b"\x89PNG another picture")
    third = engine.generate(GenerateRequest(f"{MEDIA_MARKER}what is it?", images=(other,)), chat=True)
    assert third.tokens != first.tokens or third.n_prompt > 0


def test_the_engine_refuses_images_the_template_dropped() -> None:
    engine, _ = _engine()

    class Dropping(_Plain):
        def render(self, messages, **kwargs):  # type: ignore[no-untyped-def,override]
            return "<user>nothing"

    engine.renderer = Dropping()
    with pytest.raises(ImageError, match="placed 0 of the conversation's 1 images"):
        engine.generate(GenerateRequest(f"{MEDIA_MARKER}x", images=(Image(b"p"),)), chat=True)


def test_text_after_no_image_takes_its_indices_as_positions() -> None:
    ledger = PositionLedger()
    rows = ImageRows(image_row_ids(_digest("a"), 4), n_pos=2)
    assert ledger.indexed([5, 6, 7])
    assert not ledger.indexed([5, *rows.ids])
    ledger.add(1, rows)
    assert not ledger.indexed([5, 6])  # after an image the positions are the ledger's
