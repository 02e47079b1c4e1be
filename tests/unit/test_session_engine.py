"""The session's generate policy over the scripted backend (no model)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.sampling import SamplingParams
from bmoe.errors import ContextOverflowError, DecodeError, SessionFailedError
from bmoe.service.session_engine import EngineDefaults, SessionEngine
from bmoe.testing.fake_backend import EOG, ScriptedGenerateBackend


class TinyTemplate:
    """``<u>text</u><a>answer</a>``..., then ``<a>`` (and ``[nothink]`` with thinking off)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: object = None,
    ) -> str:
        self.calls.append((len(messages), enable_thinking))
        tag = {"user": "u", "assistant": "a", "system": "s"}
        out = "".join(f"<{tag[m.role]}>{m.content}</{tag[m.role]}>" for m in messages)
        if add_generation_prompt:
            out += "<a>" + ("" if enable_thinking else "[nothink]")
        return out


def answer_then_stop(answer: str) -> object:
    """A script that, after the last ``<a>``, spells ``answer`` and then ends."""

    def next_token(context: Sequence[int]) -> int:
        text = bytes(context).decode()
        done = text[text.rfind("<a>") + 3 :]
        done = done.removeprefix("[nothink]")
        return ord(answer[len(done)]) if len(done) < len(answer) else EOG

    return next_token


def chat_engine(answer: str = "hi", **kw: object) -> tuple[SessionEngine, ScriptedGenerateBackend]:
    n_ctx = int(kw.pop("n_ctx", 256))  # type: ignore[call-overload]
    backend = ScriptedGenerateBackend(n_ctx, answer_then_stop(answer), **kw)  # type: ignore[arg-type]
    return SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=True, n_predict=32)), backend


def test_independent_prompts_reset_the_context_each_time() -> None:
    engine, backend = chat_engine()
    first = engine.generate(GenerateRequest("abc"))
    second = engine.generate(GenerateRequest("abc"))
    assert (first.text, first.tokens, first.n_prompt, first.n_past) == (
        second.text,
        second.tokens,
        second.n_prompt,
        second.n_past,
    )
    assert first.text == "hi" and first.stopped_at_eog
    assert first.n_prompt == len("<u>abc</u><a>")
    assert backend.resets == 2
    assert engine.history == [ChatMessage("user", "abc"), ChatMessage("assistant", "hi")]


def test_a_continued_chat_prefills_only_the_new_turn_and_equals_a_fresh_reprefill() -> None:
    engine, backend = chat_engine()
    engine.generate(GenerateRequest("abc"))
    second = engine.generate(GenerateRequest("de", clear_kv=False))
    rendered = "<u>abc</u><a>hi</a><u>de</u><a>"
    # the KV held "<u>abc</u><a>hi" (all of it: the end token stopped it): only
    # "</a><u>de</u><a>" is new
    assert second.n_prompt == len(rendered) - len("<u>abc</u><a>hi")
    assert second.n_past == len(rendered) + len("hi")
    assert bytes(backend.context).decode() == rendered + "hi"

    fresh, _ = chat_engine()
    fresh.history = list(engine.history[:2])
    replay = fresh.generate(GenerateRequest("de", clear_kv=False))
    assert (replay.tokens, replay.text) == (second.tokens, second.text)
    assert replay.n_prompt == len(rendered)  # nothing in memory to reuse


def test_a_pure_continuation_needs_no_trim_even_on_memory_that_refuses_one() -> None:
    engine, backend = chat_engine(partial_keep=False)
    engine.generate(GenerateRequest("abc"))
    second = engine.generate(GenerateRequest("de", clear_kv=False))
    assert second.n_prompt == len("</a><u>de</u><a>")
    assert backend.resets == 1


def test_memory_that_refuses_a_partial_trim_re_prefills_the_whole_prompt() -> None:
    # the reasoning is in the KV but not in the re-rendered history: the prompt diverges
    engine, backend = chat_engine(answer="<think>x</think>hi", partial_keep=False)
    engine.generate(GenerateRequest("abc"))
    second = engine.generate(GenerateRequest("de", clear_kv=False))
    assert second.n_prompt == len("<u>abc</u><a>hi</a><u>de</u><a>")
    assert (second.text, second.reasoning) == ("hi", "x")
    assert backend.resets == 2  # the first turn's clear, then the fallback

    trimming, trim_backend = chat_engine(answer="<think>x</think>hi")
    trimming.generate(GenerateRequest("abc"))
    reused = trimming.generate(GenerateRequest("de", clear_kv=False))
    assert reused.n_prompt == len("hi</a><u>de</u><a>")
    assert (reused.tokens, trim_backend.context) == (second.tokens, backend.context)


def test_overflow_is_refused_and_the_session_stays_usable() -> None:
    engine, backend = chat_engine(n_ctx=60)
    engine.generate(GenerateRequest("abc"))
    feeds_before = list(backend.feeds)
    expected = r"prompt \(52 tokens\) \+ n_predict \(32\) = 84 exceeds the context of 60 tokens"
    with pytest.raises(ContextOverflowError, match=expected):
        engine.generate(GenerateRequest("0123456789abcdefghijklm", clear_kv=False))
    assert backend.feeds == feeds_before
    assert len(engine.history) == 2
    assert engine.generate(GenerateRequest("x", n_predict=4)).text == "hi"


def test_cancel_rolls_the_turn_back_and_the_chat_continues_as_if_it_never_happened() -> None:
    engine, backend = chat_engine(answer="hello")
    engine.generate(GenerateRequest("abc"))

    start = len(backend.feeds)

    def cancel_on_third_decode(b: ScriptedGenerateBackend, tokens: Sequence[int], pos: int) -> None:
        if len(b.feeds) == start + 3:  # the prefill, then the feeds of "h" and "e"
            engine.cancel()

    backend.on_feed = cancel_on_third_decode
    cancelled = engine.generate(GenerateRequest("zz", clear_kv=False))
    assert cancelled.cancelled and not cancelled.stopped_at_eog
    assert cancelled.text == "he"
    assert len(engine.history) == 2
    assert bytes(backend.context).decode() == "<u>abc</u><a>hello</a><u>"[: len(backend.context)]
    backend.on_feed = None

    after = engine.generate(GenerateRequest("de", clear_kv=False))
    fresh, _ = chat_engine(answer="hello")
    fresh.generate(GenerateRequest("abc"))
    never = fresh.generate(GenerateRequest("de", clear_kv=False))
    assert (after.text, after.tokens, after.n_past) == (never.text, never.tokens, never.n_past)


def test_cancel_before_any_request_is_ignored() -> None:
    engine, _ = chat_engine()
    engine.cancel()
    assert not engine.generate(GenerateRequest("abc")).cancelled


def test_a_failed_decode_is_fatal_and_sticky() -> None:
    engine, _ = chat_engine(fail_at=2)
    with pytest.raises(DecodeError, match="scripted failure"):
        engine.generate(GenerateRequest("abc"))
    with pytest.raises(SessionFailedError, match="the session ended after a fatal error: scripted failure"):
        engine.generate(GenerateRequest("abc"))


def test_reasoning_is_parsed_out_of_the_answer_and_streamed_apart() -> None:
    engine, _ = chat_engine(answer="<think>hmm</think>\n\nOK")
    progress: list[Progress] = []
    result = engine.generate(GenerateRequest("q"), on_progress=progress.append)
    assert (result.text, result.reasoning) == ("OK", "hmm")
    assert "".join(p.delta_text for p in progress) == "OK"
    assert "".join(p.delta_reasoning for p in progress) == "hmm"
    assert [p.step for p in progress] == list(range(1, len("<think>hmm</think>\n\nOK") + 1))
    assert engine.history[-1] == ChatMessage("assistant", "OK", "hmm")


def test_defaults_fill_what_a_request_leaves_unsaid() -> None:
    backend = ScriptedGenerateBackend(n_ctx=128, next_token=lambda ctx: ord("x"))
    template = TinyTemplate()
    engine = SessionEngine(backend, template, EngineDefaults(chat=True, think=False, n_predict=3))
    result = engine.generate(GenerateRequest("q", sampling=SamplingParams(temp=0.5, seed=7)))
    assert result.text == "xxx"
    assert template.calls == [(1, False)]
    engine.generate(GenerateRequest("q", think=True, n_predict=1))
    assert template.calls[-1] == (1, True)
    assert backend.samplings == [(SamplingParams(temp=0.5, seed=7), None), (SamplingParams(), None)]


def test_raw_mode_continues_the_text_in_memory() -> None:
    backend = ScriptedGenerateBackend(n_ctx=64, next_token=lambda ctx: ord("."))
    engine = SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=False, n_predict=2))
    engine.generate(GenerateRequest("ab"))
    second = engine.generate(GenerateRequest("cd", clear_kv=False))
    assert bytes(backend.context).decode() == "ab..cd."
    assert second.n_prompt == 3  # the unfed last token of turn one, then "cd"
    assert second.n_past == len("ab..cd..")


def test_a_prompt_rendered_to_size_the_answer_is_not_rendered_again_by_generate() -> None:
    engine, _ = chat_engine("ok")
    template = engine.renderer
    assert isinstance(template, TinyTemplate)
    history = [ChatMessage("system", "Be brief.")]
    prompt = engine.render_prompt(GenerateRequest("Hi", clear_kv=False), history=history)
    renders = len(template.calls)
    result = engine.generate(GenerateRequest("Hi", n_predict=8, clear_kv=False), history=history)
    assert len(template.calls) == renders  # the same conversation: its tokens kept
    assert result.n_past == len(prompt) + len(result.tokens)
    engine.render_prompt(GenerateRequest("Hi", clear_kv=False, think=False), history=history)
    engine.render_prompt(GenerateRequest("Hi", clear_kv=False), history=[*history, ChatMessage("user", "x")])
    assert len(template.calls) == renders + 2  # another switch, another conversation: rendered
