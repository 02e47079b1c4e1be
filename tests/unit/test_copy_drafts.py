"""Copy drafts: the drafter's proposals (``domain.drafting``), the gate, and the engine's
verify loop over the scripted backend, whose next token is a pure function of the context:
there drafting must give exactly the tokens of plain steps, with fewer feeds, and leave the
context as plain steps leave it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from test_session_engine import TinyTemplate  # raw prompts here: never rendered

from bmoe.domain.drafting import CopyDrafter, DraftGate, DraftPolicy
from bmoe.domain.drafting.verify_cost import batch_price
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.service.session_engine import EngineDefaults, SessionEngine
from bmoe.testing.fake_backend import EOG, ScriptedGenerateBackend

POLICY = DraftPolicy(min_match=4, min_draft=4, max_draft=16)


# -- the drafter -----------------------------------------------------------------------------


def test_no_draft_without_a_long_enough_repeat() -> None:
    drafter = CopyDrafter([1, 2, 3, 4, 5, 6, 7, 8], POLICY)
    assert drafter.propose(16).tokens == ()


def test_the_draft_is_what_followed_the_longest_earlier_match() -> None:
    # 1 2 3 4 occurs twice before: after 9 9 1 2 3 4 (match 6 with the end) and after 7 1 2 3 4
    tokens = [9, 9, 1, 2, 3, 4, 50, 51, 52, 53, 54, 7, 1, 2, 3, 4, 60, 61, 9, 9, 1, 2, 3, 4]
    draft = CopyDrafter(tokens, POLICY).propose(16)
    assert draft.match == 6
    assert draft.tokens == (50, 51, 52, 53)  # min_draft at first


def test_a_copy_running_into_the_present_repeats_with_its_period() -> None:
    draft = CopyDrafter([5, 6, 7] * 4, POLICY).propose(16)
    assert draft.tokens == (5, 6, 7, 5)


def test_the_length_follows_what_was_taken_and_the_limit_holds() -> None:
    drafter = CopyDrafter([5, 6, 7] * 8, POLICY)
    drafter.taken(4, 4)
    assert len(drafter.propose(16).tokens) == 8
    drafter.taken(8, 8)
    assert len(drafter.propose(16).tokens) == 16
    assert len(drafter.propose(3).tokens) == 3
    drafter.taken(16, 1)
    assert len(drafter.propose(16).tokens) == 4  # cut to twice what was taken, at least min_draft


def test_drafts_are_not_longer_than_twice_the_match() -> None:
    policy = DraftPolicy(min_match=2, min_draft=2, max_draft=64)
    drafter = CopyDrafter([1, 2, 30, 31, 32, 33, 34, 35, 1, 2], policy)
    drafter.length = 64
    assert drafter.propose(64).tokens == (30, 31, 32, 33)


def test_a_policy_whose_bounds_cross_is_refused() -> None:
    with pytest.raises(ValueError):
        DraftPolicy(min_draft=9, max_draft=8)


# -- the gate --------------------------------------------------------------------------------


def test_a_verify_is_priced_at_the_expected_union_of_its_rows_experts() -> None:
    # uniform routing, 64 experts, top-8: a row's 8 of 64, then the union's growth
    assert batch_price(1, 64, 8) == 1.0
    assert batch_price(2, 64, 8) == pytest.approx(1 + 7 / 8)
    assert batch_price(9, 64, 8) == pytest.approx(8 * (1 - (7 / 8) ** 9))
    assert batch_price(10_000, 64, 8) == pytest.approx(8.0)  # every expert: 8 tokens' reads
    assert batch_price(65, 0, 0) == batch_price(65, 8, 8) == 1.0  # no routing: one read of the weights
    assert DraftPolicy(experts=(128, 8)).price(65) == pytest.approx(16 * (1 - (15 / 16) ** 65))


def test_a_verify_that_does_not_pay_its_price_pauses_until_a_longer_and_longer_match() -> None:
    gate = DraftGate(resume_match=16, price=lambda rows: batch_price(rows, 64, 8))
    gate.verified(8, 4)  # 5 tokens for a price of 5.59
    assert not gate.allow(15) and gate.allow(16) and gate.report.paused == 1
    gate.verified(8, 0)
    assert not gate.allow(31) and gate.allow(32)  # the match asked for doubles
    gate.verified(8, 0)
    assert not gate.allow(63) and gate.allow(64) and gate.report.paused == 3


def test_a_verify_that_pays_sets_the_match_back() -> None:
    gate = DraftGate(resume_match=16, price=lambda rows: batch_price(rows, 64, 8))
    gate.verified(8, 0)
    assert gate.allow(16)
    gate.verified(64, 7)  # 8 tokens for the price of 65 rows (7.996): paid
    assert gate.allow(1) and gate.report.paused == 1
    gate.verified(64, 6)  # 7 tokens: not paid, and the match asked starts again at 16
    assert not gate.allow(15) and gate.allow(16)
    assert gate.report.per_verify == pytest.approx((13 + 3) / 3)


def test_without_a_price_every_row_is_a_step() -> None:
    gate = DraftGate(resume_match=4)
    gate.verified(8, 8)  # all taken: 9 tokens for 9 rows
    assert gate.allow(1)
    gate.verified(8, 7)
    assert not gate.allow(3) and gate.allow(4)


# -- the engine ------------------------------------------------------------------------------


def copier(context: Sequence[int]) -> int:
    """Repeats the context's first 40 tokens, over and over, then ends at 200 tokens."""
    if len(context) >= 200:
        return EOG
    return context[len(context) % 40] if len(context) >= 40 else 65 + len(context) % 26


def engine(draft: DraftPolicy | None, next_token=copier) -> tuple[SessionEngine, ScriptedGenerateBackend]:
    backend = ScriptedGenerateBackend(512, next_token)
    return SessionEngine(
        backend, TinyTemplate(), EngineDefaults(chat=False, n_predict=120, draft=draft)
    ), backend  # type: ignore[arg-type]


PROMPT = "".join(chr(65 + i % 26) for i in range(40))


@pytest.mark.parametrize("n_predict", [1, 2, 17, 120, 170])
def test_drafting_gives_the_tokens_of_plain_steps_with_fewer_feeds_and_the_same_context(
    n_predict: int,
) -> None:
    plain, plain_backend = engine(None)
    want = plain.generate(GenerateRequest(PROMPT, n_predict=n_predict))
    drafted, backend = engine(POLICY)
    got = drafted.generate(GenerateRequest(PROMPT, n_predict=n_predict))
    assert got.tokens == want.tokens and got.stopped_at_eog == want.stopped_at_eog
    assert backend.context == plain_backend.context  # the KV as plain steps leave it
    assert drafted.kv_tokens == plain.kv_tokens
    assert got.drafts is not None and want.drafts is None
    if n_predict >= 17:
        assert got.drafts.verifies > 0 and got.drafts.accepted > 0
        assert len(backend.feeds) < len(plain_backend.feeds)


def test_rejected_drafts_are_cut_and_the_tokens_stay_the_model_s() -> None:
    def drifting(context: Sequence[int]) -> int:  # copies, but every 7th token is its own
        n = len(context)
        return 90 if n % 7 == 0 else copier(context)

    plain, plain_backend = engine(None, drifting)
    want = plain.generate(GenerateRequest(PROMPT, n_predict=100))
    drafted, backend = engine(POLICY, drifting)
    got = drafted.generate(GenerateRequest(PROMPT, n_predict=100))
    assert got.tokens == want.tokens
    assert backend.context == plain_backend.context
    assert got.drafts is not None and got.drafts.accepted < got.drafts.drafted


@pytest.mark.parametrize(
    "request_",
    [
        GenerateRequest(PROMPT, n_predict=60, sampling=SamplingParams(temp=0.8)),
        GenerateRequest(PROMPT, n_predict=60, sampling=SamplingParams(presence_penalty=0.5)),
        GenerateRequest(PROMPT, n_predict=60, logprobs=2),
        GenerateRequest(PROMPT, n_predict=60, draft=False),
    ],
    ids=["sampled", "penalised", "logprobs", "turned-off"],
)
def test_requests_drafts_cannot_serve_exactly_are_not_drafted(request_: GenerateRequest) -> None:
    drafted, backend = engine(POLICY)
    result = drafted.generate(request_)
    assert result.drafts is None
    assert all(len(tokens) == 1 for tokens, _ in backend.feeds[1:])


def test_a_second_turn_after_drafts_continues_as_after_plain_steps() -> None:
    plain, _ = engine(None)
    drafted, _ = engine(POLICY)
    for e in (plain, drafted):
        e.generate(GenerateRequest(PROMPT, n_predict=50))
    again = [
        e.generate(GenerateRequest("more", n_predict=30, clear_kv=False)).tokens for e in (plain, drafted)
    ]
    assert again[0] == again[1]


def test_a_request_turns_drafting_off_with_llama_cpps_speculative_n_max_0() -> None:
    from bmoe.requests.api_requests import parse_chat_completion, parse_completion
    from bmoe.requests.mapping import ServeDefaults, chat_turn, completion_request

    body = {"messages": [{"role": "user", "content": "hi"}], "speculative.n_max": 0}
    asked = parse_chat_completion(body)
    assert asked.generation.draft is False
    assert chat_turn(asked, ServeDefaults()).request.draft is False
    assert parse_chat_completion({**body, "speculative.n_max": 16}).generation.draft is True
    assert parse_chat_completion({"messages": body["messages"]}).generation.draft is True
    text = parse_completion({"prompt": "hi", "speculative.n_max": 0})
    assert completion_request(text, ServeDefaults()).draft is False


@pytest.mark.parametrize(
    ("n_batch", "n_ubatch", "want"),
    [(512, 512, (8, 64)), (64, 64, (8, 63)), (512, 32, (8, 31)), (4, 4, (3, 3)), (1, 1, (1, 1))],
)
def test_a_draft_and_its_token_fit_one_ubatch(n_batch: int, n_ubatch: int, want: tuple[int, int]) -> None:
    from types import SimpleNamespace

    from bmoe.adapters.llama import ContextParams
    from bmoe.runtime.engine_defaults import draft_policy
    from bmoe.runtime.session_config import SessionConfig

    config = SessionConfig(
        model_path="m.gguf",  # type: ignore[arg-type]
        context=ContextParams(n_batch=n_batch, n_ubatch=n_ubatch),
        draft="copy",
    )
    model = SimpleNamespace(is_recurrent_or_hybrid=False, n_swa=0, n_expert=64, n_expert_used=8)
    policy = draft_policy(config, model, [])  # type: ignore[arg-type]
    assert policy is not None and (policy.min_draft, policy.max_draft) == want
    assert policy.experts == (64, 8)  # the price of a verify is the model's
