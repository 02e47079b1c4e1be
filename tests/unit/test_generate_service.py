"""The generation use case, over the scripted backend (no model)."""

from __future__ import annotations

import pytest

from bmoe.domain.generation import GenerationRequest
from bmoe.errors import ConfigError, ContextOverflowError, DecodeError
from bmoe.service.generate import generate
from bmoe.testing.fake_backend import EOG, ScriptedGenerateBackend


def counting(context: list[int]) -> int:
    """Next token = a letter that walks the alphabet with the context length."""
    return ord("a") + len(context) % 26


def test_generates_n_predict_tokens_fed_one_by_one_after_the_prompt() -> None:
    backend = ScriptedGenerateBackend(next_token=counting)
    result = generate(backend, GenerationRequest(prompt="hi", n_predict=4))
    assert result.prompt_tokens == (ord("h"), ord("i"))
    assert result.text == "cdef"
    assert result.tokens == tuple(map(ord, "cdef"))
    # prompt at 0, then every generated token but the last at its own position
    assert backend.feeds == [((104, 105), 0), ((99,), 2), ((100,), 3), ((101,), 4)]
    assert not result.stopped_at_eog


def test_stops_at_end_of_generation_without_emitting_it() -> None:
    backend = ScriptedGenerateBackend(next_token=lambda ctx: EOG if len(ctx) >= 4 else ord("x"))
    result = generate(backend, GenerationRequest(prompt="ab", n_predict=10))
    assert result.text == "xx"
    assert result.stopped_at_eog


def test_streams_whole_utf8_characters_only() -> None:
    euro = "€".encode()
    script = iter([euro[0], euro[1], euro[2], ord("!")])
    backend = ScriptedGenerateBackend(next_token=lambda ctx: next(script))
    pieces: list[str] = []
    result = generate(backend, GenerationRequest(prompt="p", n_predict=4), on_text=pieces.append)
    assert pieces == ["€", "!"]
    assert result.text == "€!"


def test_refuses_a_prompt_that_does_not_fit_before_any_compute() -> None:
    backend = ScriptedGenerateBackend(n_ctx=8)
    with pytest.raises(ContextOverflowError, match=r"prompt \(5 tokens\) \+ n_predict \(4\) = 9 exceeds"):
        generate(backend, GenerationRequest(prompt="hello", n_predict=4))
    assert backend.feeds == []


def test_exactly_full_context_is_accepted() -> None:
    backend = ScriptedGenerateBackend(n_ctx=8, next_token=counting)
    result = generate(backend, GenerationRequest(prompt="hello", n_predict=3))
    assert len(result.tokens) == 3


def test_empty_prompt_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="the prompt is empty"):
        GenerationRequest(prompt="")


def test_decode_errors_propagate_typed() -> None:
    backend = ScriptedGenerateBackend(fail_at=2)
    with pytest.raises(DecodeError, match="scripted failure"):
        generate(backend, GenerationRequest(prompt="abc", n_predict=5))


def test_zero_n_predict_only_prefills() -> None:
    backend = ScriptedGenerateBackend()
    result = generate(backend, GenerationRequest(prompt="abc", n_predict=0))
    assert result.tokens == ()
    assert backend.feeds == [((97, 98, 99), 0)]
