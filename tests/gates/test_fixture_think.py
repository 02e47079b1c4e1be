"""``qwen3moe-think`` decodes greedily like a scripted thinking chat model, in stock llama.cpp and in bmoe.

After any chat rendered with the fixtures' template, greedy decoding writes
``<think>\\nplan\\n</think>\\n\\nOK<|im_end|>`` (thinking on) or ``OK<|im_end|>``
(thinking off), on the first turn and on every follow-up turn of the same
context, with a top-2 logit gap of about 12 at every step. Checked with stock
``llama_cpp.Llama`` and with bmoe's adapter (argmax of ``LlamaContext.logits``),
and adding it left the existing fixtures' bytes as they were.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.testing.fixtures import (
    FIXTURES,
    SCRIPTED_FIXTURES,
    THINK_ANSWER,
    THINK_COMPLETION,
    THINK_OFF_COMPLETION,
    THINK_REASONING,
    build_fixture,
    build_vocab,
    encode,
    get_spec,
    render_chat,
)
from bmoe.testing.fixtures.archs.scripted import rope_gap

NAME = "qwen3moe-think"
N_CTX = 512
MIN_MARGIN = 10.0
LIMIT = 24
QWEN3MOE_SEED0_SHA256 = "734ae6ac8f7a1252186685e5199d9932bcad4fd9eb5facccd68284251b469aaf"
"""sha256 of ``qwen3moe.gguf`` seed 0 as built before the think fixture existed."""

IM_END = build_vocab().token_id("<|im_end|>")
ON = [*encode(THINK_COMPLETION, parse_special=True), IM_END]
OFF = [*encode(THINK_OFF_COMPLETION, parse_special=True), IM_END]

USER_TURNS: tuple[tuple[str, ...], ...] = (
    ("Hi", "What is two plus two?", "And the capital of France?"),
    ("", "OK", "<think>\nfake\n</think>\n\nnaïve café ☕\n\n"),
    ("The quick brown fox jumps over the lazy dog.\n", "Once upon a time"),
)
SYSTEM = {"role": "system", "content": "Answer in one word."}

TinyModelPath = Callable[..., Path]
Messages = list[dict[str, Any]]
Greedy = Callable[[list[int]], tuple[list[int], list[float]]]
"""Greedy decoding of a prompt in one running context: (tokens up to ``<|im_end|>``, top-2 gaps)."""


def margin(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


# --- the two backends, each one context kept over the turns of a chat --------------------


@pytest.fixture(scope="module")
def stock(tiny_model_path: TinyModelPath) -> Iterator[llama_cpp.Llama]:
    llm = llama_cpp.Llama(model_path=str(tiny_model_path(NAME)), n_ctx=N_CTX, n_threads=2, verbose=False)
    yield llm
    llm.close()


def stock_greedy(llm: llama_cpp.Llama) -> Greedy:
    """Temperature-0 ``Llama.generate``; a later prompt reuses the cached prefix, as chat does."""
    llm.reset()

    def run(prompt: list[int]) -> tuple[list[int], list[float]]:
        out: list[int] = []
        gaps: list[float] = []
        for token in llm.generate(prompt, temp=0.0, top_k=1):
            row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            gaps.append(margin(np.ctypeslib.as_array(row, shape=(llm.n_vocab(),))))
            out.append(int(token))
            if token == llm.token_eos() or len(out) == LIMIT:
                break
        return out, gaps

    return run


@pytest.fixture(scope="module")
def model(tiny_model_path: TinyModelPath) -> Iterator[LlamaModel]:
    with LlamaModel(tiny_model_path(NAME)) as m:
        yield m


def adapter_greedy(model: LlamaModel, ctx: LlamaContext) -> Greedy:
    """Argmax of ``ctx.logits()``; a later prompt keeps the common prefix, decodes the rest."""
    held: list[int] = []
    ctx.clear()

    def run(prompt: list[int]) -> tuple[list[int], list[float]]:
        keep = 0
        while keep < min(len(held), len(prompt) - 1) and held[keep] == prompt[keep]:
            keep += 1
        assert ctx.remove_from(keep)
        ctx.decode(prompt[keep:], keep)
        held[:] = prompt
        out: list[int] = []
        gaps: list[float] = []
        while len(out) < LIMIT:
            logits = ctx.logits()
            token = int(np.argmax(logits))
            out.append(token)
            gaps.append(margin(logits))
            if model.is_eog(token):
                break
            ctx.decode([token], len(held))
            held.append(token)
        return out, gaps

    return run


@pytest.fixture(params=["stock", "adapter-fa-off", "adapter-fa-on"])
def greedy(request: pytest.FixtureRequest, stock: llama_cpp.Llama, model: LlamaModel) -> Iterator[Greedy]:
    if request.param == "stock":
        yield stock_greedy(stock)
        return
    params = ContextParams(n_ctx=N_CTX, n_threads=2, flash_attn=request.param.rsplit("-", 1)[1])
    with LlamaContext(model, params) as ctx:
        yield adapter_greedy(model, ctx)


def prompt_ids(messages: Messages, thinking: bool) -> list[int]:
    return encode(render_chat(messages, enable_thinking=thinking), parse_special=True)


def check(run: Greedy, messages: Messages, thinking: bool) -> str:
    """Generate the next assistant turn of ``messages``; it must be the script, by a clear margin."""
    out, gaps = run(prompt_ids(messages, thinking))
    assert out == (ON if thinking else OFF), (messages, out)
    assert min(gaps) > MIN_MARGIN, gaps
    return THINK_COMPLETION if thinking else THINK_OFF_COMPLETION


# --- behaviour --------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [True, False], ids=["think", "no-think"])
@pytest.mark.parametrize("turns", USER_TURNS, ids=["plain", "odd", "newlines"])
def test_every_turn_of_a_chat_is_the_script(greedy: Greedy, turns: tuple[str, ...], thinking: bool) -> None:
    messages: Messages = [SYSTEM] if turns[0] == "" else []
    for text in turns:
        messages.append({"role": "user", "content": text})
        reply = check(greedy, messages, thinking)
        messages.append({"role": "assistant", "content": reply})


def test_thinking_can_change_between_turns(greedy: Greedy) -> None:
    messages: Messages = []
    for i, thinking in enumerate((False, True, True, False)):
        messages.append({"role": "user", "content": f"Question {i}"})
        messages.append({"role": "assistant", "content": check(greedy, messages, thinking)})


def test_a_turn_appended_to_the_raw_generated_tokens_is_the_script(greedy: Greedy) -> None:
    """Continuing the context as generated (the reasoning kept, not re-rendered) works the same."""
    prompt = prompt_ids([{"role": "user", "content": "Hi"}], thinking=True)
    assert greedy(prompt)[0] == ON
    follow_up = encode("\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n", parse_special=True)
    out, gaps = greedy(prompt + ON + follow_up)
    assert out == ON and min(gaps) > MIN_MARGIN


def test_the_script_holds_deep_into_the_context(greedy: Greedy) -> None:
    messages: Messages = [{"role": "user", "content": "the world of tiny models " * 60}]
    assert N_CTX - 2 * len(ON) < len(prompt_ids(messages, True)) < N_CTX - len(ON)
    check(greedy, messages, thinking=True)


def test_stock_completion_text_is_the_reasoning_then_the_answer(stock: llama_cpp.Llama) -> None:
    stock.reset()
    for thinking, text in ((True, THINK_COMPLETION), (False, THINK_OFF_COMPLETION)):
        prompt = render_chat([{"role": "user", "content": "Hi"}], enable_thinking=thinking)
        result = stock.create_completion(prompt, max_tokens=LIMIT, temperature=0.0)
        choice = result["choices"][0]  # type: ignore[index]
        assert (choice["text"], choice["finish_reason"]) == (text, "stop")
    assert f"<think>\n{THINK_REASONING}\n</think>\n\n{THINK_ANSWER}" == THINK_COMPLETION


def test_another_seed_follows_the_same_script(tmp_path: Path) -> None:
    path = build_fixture(NAME, tmp_path, seed=1)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_threads=2, verbose=False)
    try:
        run = stock_greedy(llm)
        check(run, [{"role": "user", "content": "Hi"}], thinking=True)
        check(run, [{"role": "user", "content": "Hi"}], thinking=False)
    finally:
        llm.close()


# --- the fixture itself -----------------------------------------------------------------


def test_think_fixture_is_a_qwen3moe_of_the_qwen3moe_shapes_outside_the_random_registry(
    model: LlamaModel,
) -> None:
    spec = get_spec(NAME)
    assert spec is SCRIPTED_FIXTURES[NAME] and NAME not in FIXTURES
    assert (spec.arch, spec.dims, spec.scripted_think) == ("qwen3moe", FIXTURES["qwen3moe"].dims, True)
    assert model.arch == "qwen3moe" and model.n_expert == spec.dims.n_expert
    assert model.is_eog(IM_END)


def test_previous_token_head_wins_at_every_distance_of_the_trained_context() -> None:
    dims = get_spec(NAME).dims
    assert rope_gap(dims.n_ctx_train, dims.rope_freq_base, dims.head_dim) > 0.2


def test_existing_fixture_bytes_did_not_change(tmp_path: Path) -> None:
    path = build_fixture("qwen3moe", tmp_path, seed=0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == QWEN3MOE_SEED0_SHA256
