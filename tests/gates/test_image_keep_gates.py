"""An image seen in an earlier turn is neither decoded nor encoded again (issue 64), on the
two vision fixtures, resident and streamed: turn 2 of a conversation whose KV another
conversation took (so its image's rows are fed again) uses the embeddings the encoder kept
and answers bit for bit (tokens and last logits) as a fresh session's turn 2, which encodes
the image itself. With nothing kept (``image_cache_mb=0``) the picture is encoded again from
its bytes, to the same answer. A turn whose KV still holds the image feeds no image rows
and encodes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from test_image_gates import PARAMS, PICTURE_A, PICTURE_B

from bmoe.adapters.llama import vision as vision_adapter
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.media import MEDIA_MARKER, Image
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures.vision import VisionFixture, vision_fixture

pytestmark = pytest.mark.skipif(
    not vision_adapter.available(), reason="llama-cpp-python built without libmtmd"
)

ASK = f"{MEDIA_MARKER}What is in the picture?"
TURN_1 = GenerateRequest(ASK, n_predict=6, clear_kv=False, images=(Image(PICTURE_A),))
TURN_2 = GenerateRequest("And its colours?", n_predict=6, clear_kv=False)
OTHER = GenerateRequest("Unrelated text to take the context.", n_predict=4, clear_kv=False)


@pytest.fixture(params=["mlp", "qwen3vl"])
def fixture(request: pytest.FixtureRequest) -> VisionFixture:
    return vision_fixture(request.param)


def opened(fx: VisionFixture, mode: str, **fields: object) -> Session:
    stream = StreamConfig(enabled=True, cache_mb=0) if mode == "streamed" else StreamConfig()
    session = Session.open(
        SessionConfig(  # type: ignore[arg-type]
            model_path=fx.model, context=PARAMS, mmproj=fx.mmproj, chat=True, stream=stream, **fields
        )
    )
    if mode == "streamed":
        assert session.streaming is not None, session.notes
        session.streaming.set_budget(session.streaming.info.entry_bytes)  # one entry: all read
    return session


def history(answer: str) -> list[ChatMessage]:
    return [ChatMessage("user", ASK, images=(Image(PICTURE_A),)), ChatMessage("assistant", answer)]


@pytest.mark.parametrize("mode", ["resident", "streamed"])
def test_turn_2_with_the_kept_embeddings_is_a_fresh_sessions_turn_2(
    fixture: VisionFixture, mode: str
) -> None:
    with opened(fixture, mode) as s:
        first = s.generate(TURN_1, history=[])
        encoder = s.vision
        assert encoder is not None and (encoder.decoded, encoder.encoded) == (1, 1)
        s.generate(OTHER, history=[])  # another conversation takes the context
        hits = encoder.keep.counters.hits
        again = s.generate(TURN_2, history=history(first.text))
        assert (encoder.decoded, encoder.encoded) == (1, 1), "the image was decoded or encoded again"
        assert encoder.keep.counters.hits > hits  # its rows were fed, from the kept embeddings
        logits = s.last_logits()
    with opened(fixture, mode) as fresh:
        expected = fresh.generate(TURN_2, history=history(first.text))
        assert fresh.vision is not None and fresh.vision.encoded == 1
        expected_logits = fresh.last_logits()
    assert again.tokens == expected.tokens
    assert np.array_equal(logits, expected_logits)


def test_with_nothing_kept_the_picture_is_encoded_again_to_the_same_answer(fixture: VisionFixture) -> None:
    with opened(fixture, "resident", image_cache_mb=0) as s:
        first = s.generate(TURN_1, history=[])
        encoder = s.vision
        assert encoder is not None
        s.generate(OTHER, history=[])
        again = s.generate(TURN_2, history=history(first.text))
        assert encoder.encoded == 2  # nothing kept: encoded again...
        assert encoder.decoded == 2  # ...from its picture (tokenizing it decoded nothing)
        assert encoder.keep.bytes == len(PICTURE_A)  # the picture, pinned for its turns
        logits = s.last_logits()
    with opened(fixture, "resident") as fresh:
        expected = fresh.generate(TURN_2, history=history(first.text))
        expected_logits = fresh.last_logits()
    assert again.tokens == expected.tokens
    assert np.array_equal(logits, expected_logits)


def test_a_turn_whose_kv_holds_the_image_encodes_nothing(fixture: VisionFixture) -> None:
    with opened(fixture, "resident") as s:
        first = s.generate(TURN_1, history=[])
        encoder = s.vision
        assert encoder is not None
        hits = encoder.keep.counters.hits
        s.generate(TURN_2, history=history(first.text))
        assert (encoder.decoded, encoder.encoded) == (1, 1)
        assert encoder.keep.counters.hits == hits  # no image rows fed: the KV held them
        other = s.generate(GenerateRequest(ASK, n_predict=2, images=(Image(PICTURE_B),)), history=[])
        assert (encoder.decoded, encoder.encoded) == (2, 2)  # a new picture: decoded, encoded
        assert other.text is not None
