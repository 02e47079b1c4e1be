"""The vision fixtures are real to llama.cpp's mtmd (issue 55): each language model and its
mmproj load as a pair, a picture becomes the image chunk the fixture predicts (tokens and
positions, 1-D or M-RoPE), the encoder's embeddings are finite, alive and the same bytes
twice, and the whole prompt decodes; an mmproj made for the other model is refused.

Bindings are llama-cpp-python's own (``llama_cpp``, ``llama_cpp.mtmd_cpp``), not bmoe's.
"""

from __future__ import annotations

import ctypes
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from PIL import Image

from bmoe.testing.fixtures.mmproj import MMPROJ_SPECS, Projector, write_mmproj
from bmoe.testing.fixtures.vision import VISION_KINDS, VisionFixture, VisionKind, vision_fixture

try:
    from llama_cpp import mtmd_cpp as mtmd
except (OSError, RuntimeError) as exc:  # load_shared_library: the file is missing or does not load
    pytest.skip(f"llama_cpp.mtmd_cpp cannot load libmtmd: {exc}", allow_module_level=True)

MARKER = "<__media__>"
PROMPT = f"<|im_start|>user\nWhat is in {MARKER} this picture?<|im_end|>\n<|im_start|>assistant\n"
PICTURES = {"mlp": (40, 24), "qwen3vl": (64, 48)}
"""A picture per fixture: ``mlp`` squares it to 32x32 (16 tokens); ``qwen3vl`` keeps 64x48, so
4x3 tokens over 4 positions, and its 8x6 patches interpolate the 8x8 position grid."""
N_THREADS = 2
TEXT, IMAGE = mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT, mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE


@pytest.fixture(scope="module", autouse=True)
def backend() -> None:
    llama_cpp.llama_backend_init()


@pytest.fixture(scope="module", params=VISION_KINDS)
def fixture(request: pytest.FixtureRequest) -> VisionFixture:
    return vision_fixture(request.param)


@contextmanager
def text_model(path: Path) -> Iterator[Any]:
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp did not load {path}"
    try:
        yield model
    finally:
        llama_cpp.llama_model_free(model)


def projector_params() -> Any:
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.warmup = False  # a Qwen-VL warmup encodes a 46x46-token picture
    params.n_threads = N_THREADS
    params.print_timings = False
    return params


@contextmanager
def projector(mmproj: Path, model: Any) -> Iterator[Any]:
    ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), model, projector_params())
    assert ctx, f"mtmd did not load {mmproj}"
    try:
        yield ctx
    finally:
        mtmd.mtmd_free(ctx)


def png(width: int, height: int) -> bytes:
    """A picture with something in it: colour ramps across and down, a square in a corner."""
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    rgb = np.stack(np.broadcast_arrays(x, y, 255 - (x + y) / 2), axis=-1).astype(np.uint8)
    rgb[: height // 3, : width // 3] = (250, 20, 20)
    out = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(out, format="PNG")
    return out.getvalue()


@contextmanager
def tokenized(ctx: Any, picture: bytes, prompt: str = PROMPT) -> Iterator[Any]:
    """The chunks of ``prompt`` with ``picture`` at its marker."""
    buf = (ctypes.c_uint8 * len(picture)).from_buffer_copy(picture)
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(picture), False)
    assert bitmap, "mtmd did not decode the PNG"
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        encoded = prompt.encode()
        text = mtmd.mtmd_input_text(text=encoded, text_len=len(encoded), add_special=True, parse_special=True)
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        yield chunks
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)


def chunk_list(chunks: Any) -> list[Any]:
    return [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))]


def image_chunk(chunks: Any) -> Any:
    (chunk,) = [c for c in chunk_list(chunks) if mtmd.mtmd_input_chunk_get_type(c) == IMAGE]
    return chunk


def encode(ctx: Any, chunk: Any, n_embd: int) -> np.ndarray:
    """The chunk's embeddings, copied out of mtmd's buffer: ``(n_tokens, n_embd)``."""
    assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
    n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
    out = mtmd.mtmd_get_output_embd(ctx)
    assert out
    return np.ctypeslib.as_array(out, shape=(n_tokens * n_embd,)).copy().reshape(n_tokens, n_embd)


def test_each_pair_loads_with_the_position_scheme_of_its_language_model(fixture: VisionFixture) -> None:
    with text_model(fixture.model) as model, projector(fixture.mmproj, model) as ctx:
        assert llama_cpp.llama_model_n_embd(model) == fixture.n_embd
        assert mtmd.mtmd_support_vision(ctx)
        assert not mtmd.mtmd_support_audio(ctx)
        assert mtmd.mtmd_decode_use_mrope(ctx) is fixture.mrope
        rope = llama_cpp.llama_model_rope_type(model)
        assert rope == (llama_cpp.LLAMA_ROPE_TYPE_IMROPE if fixture.mrope else llama_cpp.LLAMA_ROPE_TYPE_NEOX)


def test_a_picture_becomes_the_image_chunk_the_fixture_predicts(fixture: VisionFixture) -> None:
    width, height = PICTURES[fixture.kind]
    with (
        text_model(fixture.model) as model,
        projector(fixture.mmproj, model) as ctx,
        tokenized(ctx, png(width, height)) as chunks,
    ):
        parts = chunk_list(chunks)
        assert [mtmd.mtmd_input_chunk_get_type(c) for c in parts] == [TEXT, IMAGE, TEXT]
        image = parts[1]
        assert mtmd.mtmd_input_chunk_get_n_tokens(image) == fixture.n_image_tokens(width, height)
        assert mtmd.mtmd_input_chunk_get_n_pos(image) == fixture.n_image_pos(width, height)
        if fixture.mrope:
            assert fixture.n_image_pos(width, height) < fixture.n_image_tokens(width, height)
        for text in (parts[0], parts[2]):
            assert mtmd.mtmd_input_chunk_get_n_pos(text) == mtmd.mtmd_input_chunk_get_n_tokens(text) > 0
        total = sum(mtmd.mtmd_input_chunk_get_n_pos(c) for c in parts)
        assert mtmd.mtmd_helper_get_n_pos(chunks) == total


def test_the_fixture_predicts_the_grid_of_pictures_of_any_size(fixture: VisionFixture) -> None:
    """Small (scaled up to the 8-token least), wide, tall and odd sizes."""
    sizes = [(64, 48), (20, 20), (100, 30), (33, 95), (7, 90), (130, 129)]
    with text_model(fixture.model) as model, projector(fixture.mmproj, model) as ctx:
        for width, height in sizes:
            with tokenized(ctx, png(width, height), MARKER) as chunks:
                tokens = mtmd.mtmd_input_chunk_get_tokens_image(image_chunk(chunks))
                grid = (mtmd.mtmd_image_tokens_get_nx(tokens), mtmd.mtmd_image_tokens_get_ny(tokens))
            across, down = fixture.image_grid(width, height)
            # mtmd keeps the grid for M-RoPE positions, else the count in one row
            assert grid == ((across, down) if fixture.mrope else (across * down, 1)), (width, height)
            assert across * down >= (8 if fixture.mrope else 1)


def test_the_encoder_gives_finite_live_embeddings_and_the_same_bytes_twice(fixture: VisionFixture) -> None:
    width, height = PICTURES[fixture.kind]
    with (
        text_model(fixture.model) as model,
        projector(fixture.mmproj, model) as ctx,
        tokenized(ctx, png(width, height)) as chunks,
    ):
        chunk = image_chunk(chunks)
        first = encode(ctx, chunk, fixture.n_embd)
        second = encode(ctx, chunk, fixture.n_embd)
    assert first.shape == (fixture.n_image_tokens(width, height), fixture.n_embd)
    assert np.isfinite(first).all()
    assert np.abs(first).max() > 0
    assert not np.allclose(first, first[0]), "every image token has the same embedding"
    assert first.tobytes() == second.tobytes()


def test_the_whole_prompt_decodes_in_its_language_model(fixture: VisionFixture) -> None:
    width, height = PICTURES[fixture.kind]
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 256, 64, 64
    params.n_threads = params.n_threads_batch = N_THREADS
    with (
        text_model(fixture.model) as model,
        projector(fixture.mmproj, model) as ctx,
        tokenized(ctx, png(width, height)) as chunks,
    ):
        lctx = llama_cpp.llama_init_from_model(model, params)
        assert lctx
        try:
            n_past = llama_cpp.llama_pos(0)
            assert mtmd.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 64, True, ctypes.byref(n_past)) == 0
            assert n_past.value == mtmd.mtmd_helper_get_n_pos(chunks)
            n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,))
            assert np.isfinite(logits).all()
        finally:
            llama_cpp.llama_free(lctx)


@pytest.mark.parametrize(("model_kind", "mmproj_kind"), [("mlp", "qwen3vl"), ("qwen3vl", "mlp")])
def test_an_mmproj_made_for_the_other_model_is_refused(
    model_kind: VisionKind, mmproj_kind: VisionKind
) -> None:
    model_fixture, mmproj_fixture = vision_fixture(model_kind), vision_fixture(mmproj_kind)
    assert model_fixture.n_embd != mmproj_fixture.n_embd
    with text_model(model_fixture.model) as model:
        ctx = mtmd.mtmd_init_from_file(str(mmproj_fixture.mmproj).encode(), model, projector_params())
        if ctx:
            mtmd.mtmd_free(ctx)
    # mtmd logs "mismatch between text model (n_embd = ..) and mmproj (n_embd = ..)"; each
    # mmproj loads with its own model (the tests above), so the width is what it refuses
    assert not ctx, "mtmd took a projector whose output width is not the model's"


@pytest.mark.parametrize("projector_type", sorted(MMPROJ_SPECS))
def test_an_mmproj_is_the_same_bytes_for_a_seed(projector_type: Projector, tmp_path: Path) -> None:
    spec = MMPROJ_SPECS[projector_type]
    first = write_mmproj(spec, tmp_path / "a.gguf", seed=3).read_bytes()
    assert write_mmproj(spec, tmp_path / "b.gguf", seed=3).read_bytes() == first
    assert write_mmproj(spec, tmp_path / "c.gguf", seed=4).read_bytes() != first
