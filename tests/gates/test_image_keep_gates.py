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


@pytest.mark.parametrize("size", [(64, 48), (200, 33), (31, 97), (1000, 700)])
def test_a_placeholder_counts_the_rows_and_positions_the_pictures_own_chunk_has(
    fixture: VisionFixture, size: tuple[int, int]
) -> None:
    """The encoder tokenizes every picture as mtmd's placeholder of its size: the same
    tokens, rows and positions as mtmd's own chunk of the picture's pixels."""
    import ctypes

    from test_image_gates import png

    from bmoe.adapters.llama import LlamaModel
    from bmoe.adapters.llama.vision import VisionEncoder

    picture = png(7, size)
    text = f"Look: {MEDIA_MARKER} and {MEDIA_MARKER}."
    with LlamaModel(fixture.model) as model:
        encoder = VisionEncoder(model, fixture.mmproj, n_threads=2)
        try:
            ours = encoder.tokenize(text, [Image(picture), Image(PICTURE_B)])
            lib, pixels = encoder._lib, [encoder._decode(Image(p)) for p in (picture, PICTURE_B)]
            bitmaps = [encoder._bitmap(p.nx, p.ny, p.digest, p) for p in pixels]  # real pixels
            chunks = lib.mtmd_input_chunks_init()
            data = text.encode()
            inp = lib.mtmd_input_text(text=data, text_len=len(data), add_special=False, parse_special=True)
            array = (lib.mtmd_bitmap_p_ctypes * 2)(*bitmaps)
            assert lib.mtmd_tokenize(encoder.ctx, chunks, ctypes.byref(inp), array, 2) == 0
            theirs: list[int] = []
            placed = 0
            for i in range(lib.mtmd_input_chunks_size(chunks)):
                chunk = lib.mtmd_input_chunks_get(chunks, i)
                if lib.mtmd_input_chunk_get_type(chunk) == lib.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ptr = lib.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    theirs += ptr[: n.value]
                    continue
                rows = ours.images[placed]
                placed += 1
                n_tokens = lib.mtmd_input_chunk_get_n_tokens(chunk)
                image = lib.mtmd_input_chunk_get_tokens_image(chunk)
                assert (n_tokens, lib.mtmd_input_chunk_get_n_pos(chunk)) == (rows.n_tokens, rows.n_pos)
                if encoder.mrope:
                    mine = encoder.positions(rows.key, 7)
                    for j in range(n_tokens):
                        p = lib.mtmd_image_tokens_get_decoder_pos(image, 7, j)
                        assert tuple(mine[:, j]) == (p.t, p.y, p.x, p.z)
                assert encoder.non_causal(rows.key) == bool(
                    lib.mtmd_decode_use_non_causal(encoder.ctx, chunk)
                )
                theirs += rows.ids
            lib.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                lib.mtmd_bitmap_free(bitmap)
            assert placed == 2 and ours.tokens[-len(theirs) :] == theirs  # after a BOS, if any
        finally:
            encoder.close()
