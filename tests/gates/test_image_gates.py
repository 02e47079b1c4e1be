"""Images in the prompt (issue 55) on the two vision fixtures (``bmoe.testing.fixtures.vision``:
``mlp``, 1-D positions; ``qwen3vl``, M-RoPE): streamed equals resident bit for bit (tokens and
last logits; fast path and reference policy; one and two read lanes; warm and cold), the
streaming hook serves every MoE layer of every image batch, bmoe's decode of an image equals
llama.cpp's own mtmd helper's, the picture matters, a conversation with an image restored
from the prompt cache (memory and disk) answers as a fresh one, and what cannot be used is
refused by name with the session going on.
"""

from __future__ import annotations

import ctypes
import functools
import io
import math
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.adapters.llama import vision as vision_adapter
from bmoe.adapters.protocol import DecideDone, Done, Error, parse_response
from bmoe.domain.decide import DecideConfig, DecideRequest
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.media import MEDIA_MARKER, Image, is_image_row
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ImageError, VisionEncoderError
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures.vision import VisionFixture, vision_fixture

pytestmark = pytest.mark.skipif(
    not vision_adapter.available(), reason="llama-cpp-python built without libmtmd"
)

PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
KINDS = ("mlp", "qwen3vl")


def png(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    from PIL import Image as Picture

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Picture.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


PICTURE_A, PICTURE_B = png(1), png(2)
OTHER_PICTURE = png(3, (48, 64))


def ask(picture: bytes | None, text: str = "Describe it in a few words.", n: int = 8) -> GenerateRequest:
    if picture is None:
        return GenerateRequest(text, n_predict=n)
    return GenerateRequest(f"{MEDIA_MARKER}{text}", n_predict=n, images=(Image(picture, name="the picture"),))


REQUEST = ask(PICTURE_A)


@pytest.fixture(params=KINDS)
def fixture(request: pytest.FixtureRequest) -> VisionFixture:
    return vision_fixture(request.param)


def config(fx: VisionFixture, **fields: object) -> SessionConfig:
    return SessionConfig(model_path=fx.model, context=PARAMS, mmproj=fx.mmproj, **fields)  # type: ignore[arg-type]


def streamed(fx: VisionFixture, *, entries: int | None = 1, policy: str = "fast", lanes: int = 4) -> Session:
    stream = StreamConfig(enabled=True, cache_mb=0, policy=policy, io_threads=lanes)
    session = Session.open(config(fx, stream=stream))
    assert session.streaming is not None, session.notes
    if entries is not None:
        session.streaming.set_budget(entries * session.streaming.info.entry_bytes)
    return session


@functools.cache
def resident(kind: str, request: GenerateRequest = REQUEST) -> tuple[tuple[int, ...], np.ndarray]:
    with Session.open(config(vision_fixture(kind))) as s:  # type: ignore[arg-type]
        result = s.generate(request)
        return result.tokens, s.last_logits()


@pytest.mark.parametrize("policy", ["fast", "reference"])
@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("entries", [None, 1])
def test_streamed_equals_resident_with_an_image(
    fixture: VisionFixture, policy: str, lanes: int, entries: int | None
) -> None:
    tokens, logits = resident(fixture.kind)
    assert len(tokens) == REQUEST.n_predict
    with streamed(fixture, entries=entries, policy=policy, lanes=lanes) as s:
        result = s.generate(REQUEST)
        assert result.tokens == tokens
        assert np.array_equal(s.last_logits(), logits)
        assert s.streaming is not None and s.streaming.counters().bytes_read > 0


@pytest.mark.parametrize("mode", ["resident", "streamed"])
def test_a_warm_session_equals_the_cold_run(fixture: VisionFixture, mode: str) -> None:
    """After another image and a text request, the same image gives the cold run's output."""
    tokens, logits = resident(fixture.kind)
    session = Session.open(config(fixture)) if mode == "resident" else streamed(fixture, entries=3)
    with session:
        session.generate(ask(OTHER_PICTURE))
        session.generate(ask(None, "Something else entirely."))
        warm = session.generate(REQUEST)
        assert warm.tokens == tokens
        assert np.array_equal(session.last_logits(), logits)


def test_the_streaming_hook_serves_every_moe_layer_of_every_image_batch(fixture: VisionFixture) -> None:
    """Counted by the streamer: one layer call per MoE layer per ubatch (text and image),
    the misses read through the one-entry cache."""
    with streamed(fixture, entries=1) as s:
        result = s.generate(REQUEST)
        prompt = s.engine.kv_tokens[: result.n_prompt]
        n_layer = s.model.n_layer
    runs, i = [], 0
    while i < len(prompt):  # the text and image runs the backend fed, each in n_batch chunks
        j = i
        while j < len(prompt) and is_image_row(prompt[j]) == is_image_row(prompt[i]):
            j += 1
        runs.append((is_image_row(prompt[i]), j - i))
        i = j
    assert [image for image, _ in runs].count(True) == 1  # (text,) the image, text
    ubatches = sum(math.ceil(n / PARAMS.n_ubatch) for _, n in runs)
    assert result.stream is not None
    prefill = result.stream.prefill
    # llama.cpp skips the last layer's FFN for rows without outputs: a prompt's ubatches
    # before its last have none (the last layer's experts of those rows are never needed)
    assert prefill.requests + prefill.passed == n_layer * ubatches - (ubatches - 1)
    assert prefill.misses > 0


def test_the_picture_matters(fixture: VisionFixture) -> None:
    _, with_a = resident(fixture.kind)
    _, with_b = resident(fixture.kind, ask(PICTURE_B))
    _, without = resident(fixture.kind, ask(None))
    assert not np.array_equal(with_a, with_b)
    assert not np.array_equal(with_a, without) and not np.array_equal(with_b, without)


def test_bmoe_decodes_an_image_as_llama_cpps_own_mtmd_helper_does(fixture: VisionFixture) -> None:
    """The last logits after a prompt with an image, bmoe resident (its own embedding
    batches, M-RoPE positions from mtmd's API) against mtmd_helper_eval_chunks."""
    from llama_cpp import mtmd_cpp as mtmd

    prompt = ask(PICTURE_A, n=1)
    with Session.open(config(fixture)) as s:
        s.generate(prompt)
        ours = s.last_logits()
        ids = s.engine.kv_tokens
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(fixture.model).encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = PARAMS.n_ctx, PARAMS.n_batch, PARAMS.n_ubatch
    cparams.n_threads = cparams.n_threads_batch = PARAMS.n_threads
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.warmup, params.n_threads = False, False, PARAMS.n_threads
    mctx = mtmd.mtmd_init_from_file(str(fixture.mmproj).encode(), model, params)
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        buf = (ctypes.c_uint8 * len(PICTURE_A)).from_buffer_copy(PICTURE_A)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(mctx, buf, len(PICTURE_A), False)
        text = prompt.prompt.encode()
        inp = mtmd.mtmd_input_text(text=text, text_len=len(text), add_special=False, parse_special=True)
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0
        n_tokens = mtmd.mtmd_helper_get_n_tokens(chunks)
        new_past = llama_cpp.llama_pos(0)
        code = mtmd.mtmd_helper_eval_chunks(
            mctx, ctx, chunks, 0, 0, PARAMS.n_batch, True, ctypes.byref(new_past)
        )
        assert code == 0
        theirs = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(ours.size,)).copy()
        mtmd.mtmd_bitmap_free(bitmap)
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_free(mctx)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    assert n_tokens == len(ids)
    assert np.array_equal(ours, theirs)


def test_a_conversation_with_an_image_comes_back_from_the_prompt_cache(fixture: VisionFixture) -> None:
    """Turn 1 has the image; another conversation takes the context; turn 2 restores the
    state (with its images' positions) and answers as a session that never left."""
    turn_1 = GenerateRequest(
        f"{MEDIA_MARKER}What is in the picture?",
        n_predict=6,
        clear_kv=False,
        conversation="a",
        images=(Image(PICTURE_A),),
    )
    turn_2 = GenerateRequest("And its colours?", n_predict=6, clear_kv=False, conversation="a")
    other = GenerateRequest(
        "Unrelated text to take the context.", n_predict=4, clear_kv=False, conversation="b"
    )
    with Session.open(config(fixture, chat=True)) as fresh:
        fresh.generate(turn_1)
        expected = fresh.generate(turn_2)
        expected_logits = fresh.last_logits()
    with Session.open(config(fixture, chat=True, cache_ram_mb=-1)) as s:
        s.generate(turn_1)
        s.generate(other)
        again = s.generate(turn_2)
        assert again.n_restored > 0, "the state was not restored"
        assert again.tokens == expected.tokens
        assert np.array_equal(s.last_logits(), expected_logits)


def test_a_conversation_with_an_image_comes_back_from_the_disk_tier_after_a_restart(
    fixture: VisionFixture, tmp_path: Path
) -> None:
    """The state written at close, read by a new session: the same answer as a fresh one."""
    turn_1 = GenerateRequest(
        f"{MEDIA_MARKER}What is in the picture?", n_predict=6, clear_kv=False, images=(Image(PICTURE_A),)
    )
    turn_2 = GenerateRequest("And its colours?", n_predict=6, clear_kv=False)
    with Session.open(config(fixture, chat=True)) as fresh:
        fresh.generate(turn_1)
        expected = fresh.generate(turn_2)
        expected_logits = fresh.last_logits()
    disk = config(fixture, chat=True, cache_disk=tmp_path / "states")
    with Session.open(disk) as s:
        s.generate(turn_1)
        history = list(s.engine.history)
    with Session.open(disk) as s:
        s.engine.history = history  # the conversation as a client sends it back
        again = s.generate(turn_2)
        assert again.n_restored > 0, "the state was not restored"
        assert again.tokens == expected.tokens
        assert np.array_equal(s.last_logits(), expected_logits)


def test_what_cannot_be_used_is_refused_by_name_and_the_session_goes_on(fixture: VisionFixture) -> None:
    tokens, logits = resident(fixture.kind)
    with Session.open(config(fixture)) as s:
        broken = GenerateRequest(
            f"{MEDIA_MARKER}hi", images=(Image(b"not a picture", name="messages[0].content[0]"),)
        )
        with pytest.raises(ImageError, match=r"messages\[0\]\.content\[0\] is not a picture"):
            s.generate(broken)
        again = s.generate(REQUEST)
        assert again.tokens == tokens and np.array_equal(s.last_logits(), logits)
    with Session.open(SessionConfig(model_path=fixture.model, context=PARAMS)) as text_only:
        with pytest.raises(ImageError, match="loaded without a vision encoder"):
            text_only.generate(REQUEST)
        text_only.generate(ask(None))


def test_an_mmproj_for_another_model_is_refused_by_name() -> None:
    mlp, qwen3vl = vision_fixture("mlp"), vision_fixture("qwen3vl")
    with pytest.raises(
        VisionEncoderError, match=rf"{qwen3vl.mmproj.name} is not a vision encoder for this model: .*mismatch"
    ):
        Session.open(SessionConfig(model_path=mlp.model, context=PARAMS, mmproj=qwen3vl.mmproj))


def test_parallel_sequences_take_images(fixture: VisionFixture) -> None:
    """``-np 2``, three requests (two pictures and text) continuously batched: streamed
    equals resident under the same batching, bit for bit, and each answer is the one it gets
    alone (the decode steps place each sequence at its own ledger's positions)."""
    params = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, n_seq_max=2)
    requests = [REQUEST, ask(PICTURE_B), ask(None)]
    alone = [resident(fixture.kind, r)[0] for r in requests]
    outputs = {}
    for mode in ("resident", "streamed"):
        stream = StreamConfig(enabled=mode == "streamed", cache_mb=1 if mode == "streamed" else None)
        cfg = SessionConfig(model_path=fixture.model, context=params, mmproj=fixture.mmproj, stream=stream)
        with Session.open(cfg) as s:
            results = s.generate_batch(requests)
            outputs[mode] = [(r.tokens, [lp.token.logprob for lp in r.logprobs]) for r in results]
    assert outputs["streamed"] == outputs["resident"]
    assert [tokens for tokens, _ in outputs["resident"]] == alone


def decision(picture: bytes, suffix: str = "Is it a cat?", *, reuse: bool = True) -> DecideRequest:
    return DecideRequest(
        prefix=f"{MEDIA_MARKER}Look at this picture. ",
        suffix=suffix,
        choices=("yes", "no", "maybe"),
        reuse_prefix=reuse,
        images=(Image(picture),),
    )


def test_a_decision_with_an_image_in_its_prefix(fixture: VisionFixture) -> None:
    """Streamed scores equal resident ones bit for bit; the picture matters; the second
    decision on the same prefix restores its kept state (the image's rows and positions)
    and scores as one prefilled whole."""
    runs = {}
    for mode in ("resident", "streamed"):
        stream = StreamConfig(enabled=mode == "streamed", cache_mb=1 if mode == "streamed" else None)
        decide = DecideConfig(enabled=True, prefix_cache="on")
        with Session.open(config(fixture, stream=stream, decide=decide)) as s:
            first = s.decide(decision(PICTURE_A))
            second = s.decide(decision(PICTURE_A, "Is it a dog?"))
            whole = s.decide(decision(PICTURE_A, "Is it a dog?", reuse=False))
            other = s.decide(decision(PICTURE_B))
        runs[mode] = (first.choice_logp, second.choice_logp, other.choice_logp)
        assert first.n_stored > 0 and second.n_reused > 0 and whole.n_reused == 0
        assert second.choice_logp == whole.choice_logp
        assert other.choice_logp != first.choice_logp
    assert runs["streamed"] == runs["resident"]


def test_the_session_protocol_takes_images(fixture: VisionFixture) -> None:
    """``python -m bmoe.cli --session``: ``images`` on generate and decide (base64 and data:
    URIs): the session's answer; a picture that does not decode is a BMOE_ERROR that is not
    fatal, naming it, and the next line is served."""
    import base64
    import json
    import subprocess
    import sys

    b64 = base64.b64encode(PICTURE_A).decode()
    lines = [
        {"cmd": "generate", "id": 1, "prompt": REQUEST.prompt, "n_predict": 8, "images": [b64]},
        {"cmd": "generate", "id": 2, "prompt": REQUEST.prompt, "n_predict": 8, "images": [b64[:40]]},
        {
            "cmd": "generate",
            "id": 3,
            "prompt": REQUEST.prompt,
            "n_predict": 8,
            "images": [f"data:image/png;base64,{b64}"],
        },
        {
            "cmd": "decide",
            "id": 4,
            "prefix": f"{MEDIA_MARKER}Look. ",
            "suffix": "A cat?",
            "choices": ["yes", "no"],
            "images": [b64],
        },
    ]
    command = [sys.executable, "-m", "bmoe.cli", "-m", str(fixture.model), "--mmproj", str(fixture.mmproj)]
    command += ["--session", "--decide", "-c", "512", "-b", "64", "-t", "2"]
    done = subprocess.run(
        command,
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = {}
    for event in map(parse_response, done.stdout.splitlines()):
        if isinstance(event, Done | DecideDone | Error):
            answers[event.id] = event
    tokens, _ = resident(fixture.kind)
    first, broken, as_uri, decided = (answers[i] for i in (1, 2, 3, 4))
    assert isinstance(first, Done) and first.tokens == len(tokens)
    assert isinstance(broken, Error) and not broken.fatal and "images[0]" in broken.msg
    assert isinstance(as_uri, Done) and as_uri.text == first.text
    assert isinstance(decided, DecideDone), decided


def test_streamed_with_the_defaults_a_cache_filled_shrunk_and_refilled(fixture: VisionFixture) -> None:
    """``--moe-stream`` with nothing else set (the budget sized from the room), then the
    budget shrunk to one entry and grown again between requests: every answer with the
    image is the resident one, bit for bit."""
    tokens, logits = resident(fixture.kind)
    with Session.open(config(fixture, stream=StreamConfig(enabled=True))) as s:
        assert s.streaming is not None, s.notes
        entry = s.streaming.info.entry_bytes
        for budget in (None, entry, 8 * entry):
            if budget is not None:
                s.streaming.set_budget(budget)
            result = s.generate(REQUEST)
            assert result.tokens == tokens, budget
            assert np.array_equal(s.last_logits(), logits), budget
        assert s.streaming.counters().evictions > 0  # the one-entry budget evicted
