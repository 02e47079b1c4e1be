"""Session gates on the tiny fixtures (resident): S1, Sx, the stock llama.cpp oracle,
overflow, cancel. Tokens and logits compared bit for bit, except where noted."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.errors import ContextOverflowError
from bmoe.runtime import Session, SessionConfig, run
from bmoe.testing.oracle import stock_greedy

ALL = ["qwen3moe", "qwen35moe", "gpt-oss", "qwen3moe-odd", "qwen3moe-split"]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
PROMPT = "The quick brown fox jumps over the lazy dog"

TinyModel = Callable[[str], Path]


def config(path: Path, **kw: object) -> SessionConfig:
    return SessionConfig(model_path=path, context=kw.pop("context", PARAMS), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ALL)
def test_s1_a_warm_second_generate_equals_the_cold_one_shot_run(
    name: str, tiny_model_path: TinyModel
) -> None:
    cfg = config(tiny_model_path(name), n_predict=12)
    request = GenerateRequest(PROMPT)
    cold = run(cfg, request)
    with Session.open(cfg) as cold_session:
        again = cold_session.generate(request)
        cold_logits = cold_session.last_logits()
    with Session.open(cfg) as session:
        session.generate(GenerateRequest("Something else first, to warm everything up"))
        warm = session.generate(request)
        warm_logits = session.last_logits()
    assert warm.tokens == cold.tokens == again.tokens
    assert len(warm.tokens) == 12
    assert warm.text == cold.text
    assert np.array_equal(warm_logits, cold_logits)


@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe", "qwen3moe-odd", "qwen3moe-split"])
def test_oracle_greedy_equals_stock_llama_cpp(name: str, tiny_model_path: TinyModel) -> None:
    path = tiny_model_path(name)
    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
    with Session.open(config(path, context=params, n_predict=10)) as session:
        ours = session.generate(GenerateRequest(PROMPT))
        our_logits = session.last_logits()
    theirs, their_logits = stock_greedy(path, PROMPT, 10)
    assert list(ours.tokens) == theirs
    assert np.array_equal(our_logits, their_logits)


@pytest.mark.parametrize(("name", "reuses"), [("qwen3moe", True), ("qwen35moe", False)])
def test_sx_continued_chat_equals_the_history_re_prefilled(
    name: str, reuses: bool, tiny_model_path: TinyModel
) -> None:
    """Tokens equal; logits within 1e-4 (a re-prefill feeds the text in other pieces)."""
    cfg = config(tiny_model_path(name), chat=True, think=False, n_predict=8)
    with Session.open(cfg) as session:
        session.generate(GenerateRequest("Hello there"))
        second = session.generate(GenerateRequest("And then?", clear_kv=False))
        continued_logits = session.last_logits()
        history = list(session.engine.history)
        rendered = session.engine.backend.tokenize(
            session.template.render(history[:3], enable_thinking=False)
        )
    with Session.open(cfg) as fresh:
        fresh.engine.history = history[:2]
        replay = fresh.generate(GenerateRequest("And then?", clear_kv=False))
        replay_logits = fresh.last_logits()
    assert second.tokens == replay.tokens and len(second.tokens) == 8
    assert np.allclose(continued_logits, replay_logits, atol=1e-4, rtol=0)
    assert replay.n_prompt == len(rendered)
    if reuses:
        assert 0 < second.n_prompt < len(rendered)
    else:  # hybrid memory cannot drop a partial tail: the whole history is prefilled again
        assert second.n_prompt == len(rendered)
    assert second.n_past == len(rendered) + 8 == replay.n_past


def test_sx_sliding_window_falls_back_when_the_window_lost_the_prefix(tiny_model_path: TinyModel) -> None:
    """gpt-oss with a 32-token window: a 300-token answer pushes the turn's start out of the
    (256-cell) SWA cache, so the next turn cannot keep it and re-prefills; tokens equal."""
    params = ContextParams(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=2)
    cfg = config(tiny_model_path("gpt-oss"), context=params, chat=True, think=False, n_predict=300)
    with Session.open(cfg) as session:
        session.generate(GenerateRequest("Tell me a long story"))
        second = session.generate(GenerateRequest("Go on", clear_kv=False, n_predict=6))
        history = list(session.engine.history)
        rendered = session.engine.backend.tokenize(
            session.template.render(history[:3], enable_thinking=False)
        )
    with Session.open(cfg) as fresh:
        fresh.engine.history = history[:2]
        replay = fresh.generate(GenerateRequest("Go on", clear_kv=False, n_predict=6))
    assert second.n_prompt == len(rendered) == replay.n_prompt
    assert second.tokens == replay.tokens


def test_overflow_is_refused_and_the_next_request_is_served(tiny_model_path: TinyModel) -> None:
    cfg = config(tiny_model_path("qwen3moe"), n_predict=8)
    with Session.open(cfg) as session:
        before = session.generate(GenerateRequest(PROMPT))
        with pytest.raises(
            ContextOverflowError, match=r"n_predict \(250\) = \d+ exceeds the context of 256 tokens"
        ):
            session.generate(GenerateRequest(PROMPT, n_predict=250))
        after = session.generate(GenerateRequest(PROMPT))
    assert after.tokens == before.tokens


def test_cancel_from_another_thread_then_the_chat_goes_on_as_if_it_never_happened(
    tiny_model_path: TinyModel,
) -> None:
    cfg = config(tiny_model_path("qwen3moe"), chat=True, think=False, n_predict=8)
    with Session.open(cfg) as session:
        session.generate(GenerateRequest("Hello there"))
        third_token = threading.Event()
        cancelled_it = threading.Event()

        def canceller() -> None:
            third_token.wait(timeout=30)
            session.cancel()
            cancelled_it.set()

        def on_progress(p: Progress) -> None:
            if p.step == 3:
                third_token.set()
                cancelled_it.wait(timeout=30)

        thread = threading.Thread(target=canceller)
        thread.start()
        cut = session.generate(
            GenerateRequest("Something to forget", clear_kv=False, n_predict=100), on_progress
        )
        thread.join()
        after = session.generate(GenerateRequest("And then?", clear_kv=False))
    assert cut.cancelled and len(cut.tokens) == 3
    with Session.open(cfg) as never:
        never.generate(GenerateRequest("Hello there"))
        reference = never.generate(GenerateRequest("And then?", clear_kv=False))
    assert after.tokens == reference.tokens
    assert not after.cancelled


def test_the_abort_flag_stops_llama_decode_and_the_context_recovers(tiny_model_path: TinyModel) -> None:
    from bmoe.errors import DecodeAbortedError

    with Session.open(config(tiny_model_path("qwen3moe"), n_predict=4)) as session:
        expected = session.generate(GenerateRequest(PROMPT))
        session.ctx.clear()
        session.engine.backend.abort()
        with pytest.raises(DecodeAbortedError, match=r"aborted by the abort callback \(code 2\)"):
            session.ctx.decode(session.model.tokenize(PROMPT), 0)
        session.engine.backend.clear_abort()
        assert session.generate(GenerateRequest(PROMPT)).tokens == expected.tokens


def test_reasoning_is_parsed_out_of_a_thinking_models_answer(tiny_model_path: TinyModel) -> None:
    from bmoe.testing.fixtures import THINK_ANSWER, THINK_REASONING

    cfg = config(tiny_model_path("qwen3moe-think"), chat=True, think=True, n_predict=32)
    with Session.open(cfg) as session:
        progress: list[Progress] = []
        first = session.generate(GenerateRequest("Should I?"), on_progress=progress.append)
        assert (first.text, first.reasoning.strip()) == (THINK_ANSWER, THINK_REASONING)
        assert first.stopped_at_eog and "<think>" not in first.text
        assert "".join(p.delta_reasoning for p in progress).strip() == THINK_REASONING
        assert "".join(p.delta_text for p in progress) == THINK_ANSWER
        # the reasoning is dropped when the history is re-rendered: the next turn still works
        second = session.generate(GenerateRequest("And now?", clear_kv=False, think=False))
        assert (second.text, second.reasoning) == (THINK_ANSWER, "")
        assert session.engine.history[1].reasoning.strip() == THINK_REASONING
