"""The engine's caller-held conversation (``history=``), per-request mode (``chat=``) and
``stop()`` (finish now, keeping the turn), over the scripted backend (no model).

These are what an OpenAI-style server needs: each request carries the whole conversation
(system prompt included), and a stop string ends a turn without cancelling it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.errors import ConfigError
from bmoe.service.session_engine import EngineDefaults, SessionEngine
from bmoe.testing.fake_backend import EOG, ScriptedGenerateBackend

SYSTEM = ChatMessage("system", "brief")


class TinyTemplate:
    """``<s>..</s><u>..</u><a>..</a>``..., then ``<a>``."""

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: object = None,
    ) -> str:
        tag = {"user": "u", "assistant": "a", "system": "s"}
        out = "".join(f"<{tag[m.role]}>{m.content}</{tag[m.role]}>" for m in messages)
        return out + ("<a>" if add_generation_prompt else "")


def spell(answer: str) -> object:
    """After the last ``<a>`` (or from the start, in raw text), spell ``answer``, then end."""

    def next_token(context: Sequence[int]) -> int:
        text = bytes(context).decode()
        done = text[text.rfind("<a>") + 3 :] if "<a>" in text else text[text.rfind("|") + 1 :]
        return ord(answer[len(done)]) if len(done) < len(answer) else EOG

    return next_token


def engine(answer: str = "hi", *, chat: bool = True) -> tuple[SessionEngine, ScriptedGenerateBackend]:
    backend = ScriptedGenerateBackend(256, spell(answer))  # type: ignore[arg-type]
    return SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=chat, n_predict=32)), backend


def test_a_given_history_with_a_system_prompt_is_rendered_before_the_prompt() -> None:
    eng, backend = engine()
    result = eng.generate(GenerateRequest("abc", clear_kv=False), history=[SYSTEM])
    assert bytes(backend.context).decode() == "<s>brief</s><u>abc</u><a>hi"
    assert result.text == "hi"
    assert result.n_prompt == len("<s>brief</s><u>abc</u><a>")
    assert eng.history == [SYSTEM, ChatMessage("user", "abc"), ChatMessage("assistant", "hi")]


def test_a_history_that_extends_the_last_turn_prefills_only_the_new_part() -> None:
    eng, backend = engine()
    eng.generate(GenerateRequest("abc", clear_kv=False), history=[SYSTEM])
    past = [SYSTEM, ChatMessage("user", "abc"), ChatMessage("assistant", "hi")]
    second = eng.generate(GenerateRequest("de", clear_kv=False), history=past)
    rendered = "<s>brief</s><u>abc</u><a>hi</a><u>de</u><a>"
    assert second.n_prompt == len(rendered) - len("<s>brief</s><u>abc</u><a>hi")
    assert bytes(backend.context).decode() == rendered + "hi"

    fresh, _ = engine()
    replay = fresh.generate(GenerateRequest("de", clear_kv=False), history=past)
    assert (replay.tokens, replay.text, replay.n_past) == (second.tokens, second.text, second.n_past)
    assert replay.n_prompt == len(rendered)


def test_a_history_that_diverges_keeps_only_the_shared_token_prefix() -> None:
    eng, backend = engine()
    eng.generate(GenerateRequest("abc", clear_kv=False), history=[SYSTEM])
    other = [ChatMessage("system", "bright")]
    result = eng.generate(GenerateRequest("abc", clear_kv=False), history=other)
    assert result.n_prompt == len("<s>bright</s><u>abc</u><a>") - len("<s>bri")
    assert bytes(backend.context).decode() == "<s>bright</s><u>abc</u><a>hi"
    assert eng.history == [*other, ChatMessage("user", "abc"), ChatMessage("assistant", "hi")]


def test_clear_kv_with_a_history_starts_from_an_empty_context() -> None:
    eng, backend = engine()
    eng.generate(GenerateRequest("abc", clear_kv=False), history=[SYSTEM])
    result = eng.generate(GenerateRequest("abc"), history=[SYSTEM])
    assert result.n_prompt == len("<s>brief</s><u>abc</u><a>")
    assert backend.resets == 2


def test_render_prompt_counts_what_generate_would_prefill() -> None:
    eng, _ = engine()
    request = GenerateRequest("abc", clear_kv=False)
    expected = len("<s>brief</s><u>abc</u><a>")
    assert len(eng.render_prompt(request, history=[SYSTEM])) == expected
    assert len(eng.render_prompt(request, chat=False)) == len("abc")


def test_a_raw_request_in_a_chat_session_is_fed_as_text() -> None:
    eng, backend = engine("xy")
    result = eng.generate(GenerateRequest("q|", n_predict=8), chat=False)
    assert bytes(backend.context).decode() == "q|xy"
    assert result.text == "xy"
    assert eng.history == []  # a raw turn is no chat message


def test_a_chat_request_in_a_raw_session_renders_the_template() -> None:
    eng, backend = engine(chat=False)
    eng.generate(GenerateRequest("abc", clear_kv=False), history=[SYSTEM], chat=True)
    assert bytes(backend.context).decode() == "<s>brief</s><u>abc</u><a>hi"


def test_a_history_without_chat_mode_is_refused() -> None:
    eng, backend = engine(chat=False)
    with pytest.raises(ConfigError, match="a conversation history needs chat mode"):
        eng.generate(GenerateRequest("abc"), history=[SYSTEM])
    assert backend.feeds == []


def test_stop_finishes_the_turn_keeping_it_and_the_chat_goes_on() -> None:
    eng, backend = engine("hello")
    steps: list[Progress] = []

    def stop_after_two(p: Progress) -> None:
        steps.append(p)
        if p.step == 2:
            eng.stop()

    result = eng.generate(GenerateRequest("abc"), on_progress=stop_after_two)
    assert not result.cancelled and not result.stopped_at_eog
    assert (result.text, len(result.tokens), len(steps)) == ("he", 2, 2)
    assert eng.history[-1] == ChatMessage("assistant", "he")
    # the last token is not fed, as when n_predict is reached
    assert bytes(backend.context).decode() == "<u>abc</u><a>h"
    assert result.n_past == len("<u>abc</u><a>he")

    after = eng.generate(GenerateRequest("de", clear_kv=False))
    assert after.text == "hello" and after.stopped_at_eog
    assert bytes(backend.context).decode() == "<u>abc</u><a>he</a><u>de</u><a>hello"


def test_stop_when_nothing_runs_is_ignored() -> None:
    eng, _ = engine("hello")
    eng.stop()
    assert eng.generate(GenerateRequest("abc")).text == "hello"
