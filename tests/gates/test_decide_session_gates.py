"""Decisions inside a session: G18d (streamed = resident), G18e (decisions do not disturb
the chat), G18f (a session without decisions refuses them and stays usable)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.chat import ChatMessage
from bmoe.domain.decide import DecideConfig, DecideRequest, DecideResult, score_choices
from bmoe.domain.decide.prefix_cache import PrefixCacheMode
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ChoiceCollisionError, DecideDisabledError
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
TASK = "You control a phone. Task: turn on Wi-Fi. "
DECISIONS = [
    DecideRequest(prefix=TASK, suffix="Screen: Home. Options: A) Settings B) Camera.", choices=("A", "B")),
    DecideRequest(
        prefix=TASK, suffix="Screen: Settings. Options: A) Network B) Display.", choices=("A", "B")
    ),
    DecideRequest(
        prefix=TASK + "Opened Settings. ", suffix="Options: A) Wi-Fi B) Bluetooth.", choices=("A", "B")
    ),
    DecideRequest(prefix=TASK, suffix="Done? A) yes B) no", choices=("A", "B"), reuse_prefix=False),
]


def config(path: Path, prefix_cache: PrefixCacheMode = "on", **kw: object) -> SessionConfig:
    """``on`` by default: the same pieces resident and streamed (``auto`` weighs reads)."""
    return SessionConfig(
        model_path=path,
        context=PARAMS,
        chat=True,
        think=False,
        n_predict=6,
        decide=DecideConfig(enabled=True, prefix_cache=prefix_cache),
        **kw,
    )  # type: ignore[arg-type]


def decisions(session: Session) -> list[DecideResult]:
    return [session.decide(d) for d in DECISIONS]


@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe"])
@pytest.mark.parametrize("cache_mb", [0, 1, 1024])
def test_g18d_streamed_decisions_equal_resident_ones(
    name: str, cache_mb: int, tiny_model_path: TinyModel
) -> None:
    path = tiny_model_path(name)
    with Session.open(config(path)) as resident:
        expected = decisions(resident)
    with Session.open(config(path, stream=StreamConfig(enabled=True, cache_mb=cache_mb))) as streamed:
        assert streamed.streaming is not None
        got = decisions(streamed)
        reads = streamed.streaming.counters().misses
    assert [(r.best, r.choice_logp, r.n_reused) for r in got] == [
        (r.best, r.choice_logp, r.n_reused) for r in expected
    ]
    assert any(r.n_reused > 0 for r in got)  # the kept prefix state was used while streaming
    assert all(r.stream is not None for r in got) and reads > 0


@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe"])
def test_auto_streamed_decisions_equal_a_resident_computation_in_the_pieces_they_chose(
    name: str, tiny_model_path: TinyModel
) -> None:
    """``auto`` under streaming prefills some prompts in one piece where a second would read
    the experts again (``prefix_plan``): each decision equals, bit for bit, a resident
    context fed the same tokens in the same pieces (its restored state's pieces, the state it
    kept, the rest), as G18a does for the kept states."""
    path = tiny_model_path(name)
    with Session.open(config(path, "auto", stream=StreamConfig(enabled=True, cache_mb=1))) as streamed:
        got = decisions(streamed)
        backend = streamed._decide_backend
        assert backend is not None
        tokens = [backend.tokenize(backend.render(d.text), special=True) for d in DECISIONS]
    assert any(r.prefix_plan.startswith("one piece") for r in got), [r.prefix_plan for r in got]
    with Session.open(config(path)) as resident:
        reference = resident._decide_backend
        assert reference is not None
        kept_cuts: dict[tuple[int, ...], list[int]] = {}
        for request, result, toks in zip(DECISIONS, got, tokens, strict=True):
            cuts = list(kept_cuts[tuple(toks[: result.n_reused])]) if result.n_reused else []
            if result.n_stored:
                cuts.append(result.n_stored)
                kept_cuts[tuple(toks[: result.n_stored])] = list(cuts)
            reference.reset()
            start = 0
            for cut in [*cuts, len(toks)]:
                reference.prefill(toks[start:cut], start)
                start = cut
            choice_tokens = tuple(reference.tokenize(c, special=False)[0] for c in request.choices)
            assert score_choices(reference.logits(), choice_tokens).logp == result.choice_logp


@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe"])
def test_g18e_a_chat_after_decisions_equals_one_that_never_saw_them(
    name: str, tiny_model_path: TinyModel
) -> None:
    path = tiny_model_path(name)
    with Session.open(config(path)) as session:
        first = session.generate(GenerateRequest("Hello there"))
        decisions(session)
        with pytest.raises(ChoiceCollisionError):
            session.decide(DecideRequest(prefix=TASK, suffix="?", choices=("Yes", "Yes")))
        second = session.generate(GenerateRequest("And then?", clear_kv=False))
        fresh_turn = session.generate(GenerateRequest("New topic"))
        fresh_logits = session.last_logits()
    with Session.open(config(path)) as never:
        assert never.generate(GenerateRequest("Hello there")).tokens == first.tokens
        reference = never.generate(GenerateRequest("And then?", clear_kv=False))
        reference_new = never.generate(GenerateRequest("New topic"))
        reference_logits = never.last_logits()
    assert second.tokens == reference.tokens and second.n_past == reference.n_past
    assert fresh_turn.tokens == reference_new.tokens
    assert np.array_equal(fresh_logits, reference_logits)


def test_g18f_a_session_without_decide_refuses_and_stays_usable(tiny_model_path: TinyModel) -> None:
    path = tiny_model_path("qwen3moe")
    cfg = SessionConfig(model_path=path, context=PARAMS, n_predict=6)
    with Session.open(cfg) as session:
        before = session.generate(GenerateRequest("Hello"))
        with pytest.raises(
            DecideDisabledError, match=r"decide is not enabled in this session \(start it with --decide\)"
        ):
            session.decide(DECISIONS[0])
        after = session.generate(GenerateRequest("Hello"))
        assert session._decide_backend is None and session._prefix_cache is None  # nothing allocated
    assert after.tokens == before.tokens


def test_a_generate_drops_the_kept_prefix_state(tiny_model_path: TinyModel) -> None:
    with Session.open(config(tiny_model_path("qwen3moe"))) as session:
        first = session.decide(DECISIONS[0])
        again = session.decide(DECISIONS[0])
        assert first.n_reused == 0 and again.n_reused > 0
        session.generate(GenerateRequest("Hi"))
        after_chat = session.decide(DECISIONS[0])
    assert after_chat.n_reused == 0
    assert after_chat.choice_logp == first.choice_logp


@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe"])
def test_g18c_a_whole_prefill_decision_equals_perplexitys_scores_of_the_choices(
    name: str, tiny_model_path: TinyModel
) -> None:
    """Within 1e-4: perplexity() computes every output row, a decision only the last one,
    and llama.cpp does not round those two graphs the same."""
    request = DecideRequest(
        prefix=TASK, suffix="Options: A) Network B) Display.", choices=("A", "B"), reuse_prefix=False
    )
    with Session.open(config(tiny_model_path(name))) as session:
        decision = session.decide(request)
        rendered = session.template.render(
            [ChatMessage("user", request.prefix + request.suffix)], enable_thinking=False
        )
        scores = []
        for choice in request.choices:
            ppl = session.perplexity(rendered + choice)
            first = session.model.tokenize(choice, add_special=False, parse_special=False)[0]
            assert ppl.tokens[-1] == first
            scores.append(ppl.logp[-1])
        assert 1.0 < session.perplexity(rendered).value < float(session.model.n_vocab) * 10
    assert np.allclose(decision.choice_logp, scores, atol=1e-4, rtol=0)
