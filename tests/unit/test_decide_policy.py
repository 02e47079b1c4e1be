"""The decision policy over the scripted backend (no model): the split rule, the refusals,
the scoring, when the kept state is restored, stored or left alone, which failures leave
things usable, and the K-slot LRU of kept states."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bmoe.domain.decide import (
    DecideConfig,
    DecideRequest,
    DecideResult,
    LastPrefixCache,
    LruPrefixCache,
    first_tokens,
    log_softmax,
    new_prefix_cache,
    renormalise,
    split_prefix,
)
from bmoe.errors import (
    ChoiceCollisionError,
    ChoiceError,
    ConfigError,
    ContextOverflowError,
    DecideDisabledError,
    DecideOverflowError,
    DecideRefusedError,
    DecodeError,
)
from bmoe.service.decider import run_decide
from bmoe.testing.fake_decide_backend import ScriptedDecideBackend

ON = DecideConfig(enabled=True)  # auto: a CPU prefill keeps the prefix state
OFF = DecideConfig(enabled=True, prefix_cache="off")
ABC = ("A", "B", "C")
TASK = "Task: turn on Wi-Fi. History: none. "
SCREEN = "Screen: Settings. Options: A) Network B) Display C) Battery."


def decide(
    backend: ScriptedDecideBackend,
    cache: LruPrefixCache,
    prefix: str,
    suffix: str,
    choices: Sequence[str] = ABC,
    *,
    config: DecideConfig = ON,
    reuse: bool = True,
) -> DecideResult:
    request = DecideRequest(prefix=prefix, suffix=suffix, choices=tuple(choices), reuse_prefix=reuse)
    return run_decide(backend, cache, request, config)


def fresh(prefix: str, suffix: str, choices: Sequence[str] = ABC, **kw: object) -> DecideResult:
    """The same decision prefilled whole on a new backend that kept nothing."""
    return decide(ScriptedDecideBackend(**kw), LastPrefixCache(), prefix, suffix, choices, config=OFF)  # type: ignore[arg-type]


def work(backend: ScriptedDecideBackend) -> list[tuple[object, ...]]:
    """The calls that touch memory (not logits reads)."""
    return [c for c in backend.calls if c[0] != "logits"]


def n_tokens(backend: ScriptedDecideBackend, text: str) -> int:
    return len(backend.tokenize(text, special=True))


# -- the split rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("full", "alone", "expected"),
    [
        ([1, 2, 3, 4, 5], [1, 2, 3, 9], 2),  # 3 shared, one given back
        ([1, 2, 3], [1, 2, 3], 2),  # never all of the prompt: one token is prefilled
        ([1, 2, 3], [1, 2, 3, 4, 5], 2),
        ([1, 2, 3], [7, 8], 0),
        ([1, 2, 3], [1], 0),
        ([1], [1], 0),
    ],
)
def test_the_prefix_is_the_shared_tokens_less_one_given_back(
    full: list[int], alone: list[int], expected: int
) -> None:
    assert split_prefix(full, alone) == expected


def test_the_kept_state_ends_one_token_before_the_renderings_part() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    result = decide(backend, cache, TASK, SCREEN)
    n_prefix = n_tokens(backend, "<u>" + TASK) - 1
    total = n_tokens(backend, f"<u>{TASK}{SCREEN}</u><a>")
    assert work(backend) == [
        ("reset",),
        ("prefill", 0, n_prefix),
        ("save", n_prefix),
        ("prefill", n_prefix, total - n_prefix),
    ]
    assert (result.n_reused, result.n_prefilled, result.n_stored, result.n_tokens) == (
        0,
        total,
        n_prefix,
        total,
    )
    assert [k.tokens for k in cache.kept()] == [tuple(backend.tokenize("<u>" + TASK, special=True)[:-1])]


def test_a_merge_across_the_join_is_left_out_of_the_kept_prefix() -> None:
    """``o`` + ``k`` merge into one token in the whole prompt: the state kept stops before
    the join and its tokens are exactly the whole prompt's first ones."""
    backend = ScriptedDecideBackend(merges=("ok",))
    cache = LastPrefixCache()
    whole = backend.tokenize("<u>Say ok now</u><a>", special=True)
    assert whole[7] == 256  # the merged token really spans the join
    result = decide(backend, cache, "Say o", "k now")
    assert result.n_stored == 6
    assert cache.kept()[0].tokens == tuple(whole[:6])
    assert result.choice_logp == fresh("Say o", "k now", merges=("ok",)).choice_logp


def test_giving_one_token_back_lets_a_grown_prefix_whose_last_token_merges_reuse_the_state() -> None:
    """The first prefix ends in ``o``; the next one in ``ok`` (one token). Kept with its
    last token, the state would not be a prefix of the next prompt."""
    backend = ScriptedDecideBackend(merges=("ok",))
    cache = LastPrefixCache()
    first = decide(backend, cache, "Say o", " now")
    assert backend.tokenize("<u>Say o now", special=True)[7] == ord("o")
    assert backend.tokenize("<u>Say ok now", special=True)[7] == 256
    second = decide(backend, cache, "Say ok", " now")
    assert first.n_stored == 7 == second.n_reused
    assert second.choice_logp == fresh("Say ok", " now", merges=("ok",)).choice_logp


def test_an_empty_prefix_keeps_nothing() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    result = decide(backend, cache, "", SCREEN)
    assert work(backend) == [("reset",), ("prefill", 0, result.n_tokens)]
    assert result.n_stored == 0 and len(cache) == 0 and result.prefix_state_mib == 0.0


def test_an_empty_suffix_keeps_all_but_the_last_token() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    first = decide(backend, cache, TASK + SCREEN, "")
    second = decide(backend, cache, TASK + SCREEN, "")
    assert first.n_stored == first.n_tokens - 1 == second.n_reused
    assert second.n_prefilled == 1
    assert second.choice_logp == first.choice_logp


# -- refusals ---------------------------------------------------------------------------------


def test_requests_that_cannot_be_answered_are_refused_when_built() -> None:
    with pytest.raises(ChoiceError, match="empty choices list"):
        DecideRequest(prefix=TASK, choices=())
    with pytest.raises(ChoiceError, match="empty choice at index 1"):
        DecideRequest(prefix=TASK, choices=("A", ""))
    with pytest.raises(DecideRefusedError, match="prefix and suffix are both empty"):
        DecideRequest(choices=ABC)


def test_a_choice_that_tokenizes_to_nothing_is_refused() -> None:
    with pytest.raises(ChoiceError, match=r"choice 1 \('\?'\) tokenizes to nothing"):
        first_tokens(("A", "?"), ([65], []))


@pytest.mark.parametrize(
    ("request_", "config", "n_ctx", "error", "message"),
    [
        (
            DecideRequest(prefix=TASK, suffix=SCREEN, choices=ABC),
            DecideConfig(),
            256,
            DecideDisabledError,
            r"decide is not enabled in this session \(start it with --decide\)",
        ),
        (
            DecideRequest(prefix=TASK, suffix=SCREEN, choices=("Apple", "Avocado")),
            ON,
            256,
            ChoiceCollisionError,
            r"choices 0 \('Apple'\) and 1 \('Avocado'\) start with the same token 65",
        ),
        (
            DecideRequest(prefix=TASK, suffix=SCREEN, choices=("no", "ok", "okay")),
            ON,
            256,
            ChoiceCollisionError,
            r"choices 1 \('ok'\) and 2 \('okay'\) start with the same token 256",
        ),
        (
            DecideRequest(prefix=TASK, suffix=SCREEN * 3, choices=ABC),
            ON,
            128,
            DecideOverflowError,
            r"prompt \(2\d\d tokens\) exceeds the context of 128 tokens",
        ),
    ],
    ids=["disabled", "collision", "collision-through-a-merge", "overflow"],
)
def test_a_refusal_comes_before_anything_is_touched_and_the_next_decision_restores_as_before(
    request_: DecideRequest, config: DecideConfig, n_ctx: int, error: type[Exception], message: str
) -> None:
    backend = ScriptedDecideBackend(n_ctx, merges=("ok",))
    cache = LastPrefixCache()
    before = decide(backend, cache, TASK, "Screen: Home.")
    memory, calls, kept = list(backend.memory), list(backend.calls), cache.kept()
    with pytest.raises(error, match=message) as caught:
        run_decide(backend, cache, request_, config)
    assert isinstance(caught.value, DecideRefusedError)
    assert backend.memory == memory and backend.calls == calls and cache.kept() == kept
    after = decide(backend, cache, TASK, "Screen: Home.")
    assert after.n_reused == before.n_stored > 0
    assert after.choice_logp == before.choice_logp


def test_refusal_kinds_are_the_builtins_callers_already_catch() -> None:
    collision = ChoiceCollisionError("x", 0, 2, 65)
    assert (collision.first, collision.second, collision.token) == (0, 2, 65)
    assert isinstance(collision, ValueError) and isinstance(collision, ConfigError)
    assert isinstance(DecideOverflowError("x"), ContextOverflowError)


def test_choices_with_distinct_first_tokens_are_accepted_even_if_one_starts_the_other() -> None:
    backend = ScriptedDecideBackend(merges=("ok",))
    result = decide(backend, LastPrefixCache(), TASK, SCREEN, ("o", "ok"))
    assert len(result.choice_logp) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefix_cache": "on", "prefill_device": True}, "cannot be used with a prefill device"),
        ({"prefix_cache": "sometimes"}, "must be one of auto, on, off, not 'sometimes'"),
        ({"prefix_slots": 0}, "prefix_slots must be at least 1, not 0"),
    ],
)
def test_a_config_that_cannot_be_honoured_is_refused_at_startup(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        DecideConfig(enabled=True, **kwargs)  # type: ignore[arg-type]


def test_auto_keeps_the_prefix_on_the_cpu_and_not_with_a_prefill_device() -> None:
    assert DecideConfig(enabled=True).keeps_prefix
    assert not DecideConfig(enabled=True, prefill_device=True).keeps_prefix
    assert not DecideConfig(enabled=True, prefix_cache="off").keeps_prefix
    assert DecideConfig(enabled=True, prefix_cache="on").keeps_prefix


# -- scoring ----------------------------------------------------------------------------------

LN2, LN3, LN4, LN8 = math.log(2), math.log(3), math.log(4), math.log(8)


def test_log_softmax_matches_a_hand_computation() -> None:
    assert np.allclose(log_softmax([0.0, 0.0, LN2]), [-LN4, -LN4, -LN2], rtol=0, atol=1e-15)
    assert np.allclose(log_softmax([1000.0, 1000.0 + LN3]), [-LN4, LN3 - LN4], rtol=0, atol=1e-12)
    masked = log_softmax([-np.inf, 0.0, 0.0])
    assert masked[0] == -np.inf and np.allclose(masked[1:], [-LN2, -LN2], rtol=0, atol=1e-15)
    assert np.all(log_softmax([-np.inf, -np.inf]) == -np.inf)
    assert log_softmax(np.zeros(3, dtype=np.float32)).dtype == np.float64


def test_renormalised_probabilities_share_the_choices_mass() -> None:
    assert np.allclose(renormalise([-LN8, -LN8, -LN4]), [0.25, 0.25, 0.5], rtol=0, atol=1e-15)
    assert renormalise([-np.inf, -np.inf]).tolist() == [0.0, 0.0]
    assert renormalise([]).tolist() == []


def fixed_logits(tokens: Sequence[int]) -> np.ndarray:
    """p(A) = p(B) = 1/8, p(C) = 1/4, p(NUL) = 1/2, nothing else."""
    row = np.full(256, -np.inf, dtype=np.float32)
    row[[0, ord("A"), ord("B"), ord("C")]] = [LN4, 0.0, 0.0, LN2]
    return row


def test_a_choice_scores_its_first_tokens_log_probability_over_the_whole_vocabulary() -> None:
    result = decide(ScriptedDecideBackend(logits_fn=fixed_logits), LastPrefixCache(), TASK, SCREEN)
    assert np.allclose(result.choice_logp, [-LN8, -LN8, -LN4], rtol=0, atol=1e-6)
    assert result.best == 2
    assert np.allclose(result.choice_p_renorm, [0.25, 0.25, 0.5], rtol=0, atol=1e-6)


def test_a_longer_choice_is_scored_by_its_first_token_and_a_tie_goes_to_the_first() -> None:
    backend = ScriptedDecideBackend(logits_fn=fixed_logits)
    words = decide(backend, LastPrefixCache(), TASK, SCREEN, ("Alpha", "Bravo", "Charlie"))
    letters = decide(backend, LastPrefixCache(), TASK, SCREEN, ("A", "B", "C"))
    assert words.choice_logp == letters.choice_logp
    tie = decide(backend, LastPrefixCache(), TASK, SCREEN, ("B", "A"))
    assert tie.best == 0


def test_choices_are_tokenized_alone_without_the_prompts_bos() -> None:
    backend = ScriptedDecideBackend(
        logits_fn=lambda t: np.pad(fixed_logits(t), (0, 1), constant_values=-np.inf), bos=True
    )
    assert backend.tokenize("A", special=True) == [256, 65]
    result = decide(backend, LastPrefixCache(), TASK, SCREEN)
    assert np.allclose(result.choice_logp, [-LN8, -LN8, -LN4], rtol=0, atol=1e-6)


def test_a_scripted_answer_is_what_the_fake_model_chooses() -> None:
    backend = ScriptedDecideBackend(answer=lambda prompt: "A" if "Settings" in prompt else "C")
    cache = LastPrefixCache()
    assert decide(backend, cache, TASK, SCREEN).best == 0
    assert decide(backend, cache, TASK, "Screen: Home. Options: A) Phone B) Mail C) Settings").best == 0
    assert decide(backend, cache, TASK, "Screen: Home. Options: A) Phone B) Mail C) Camera").best == 2


# -- the kept state: restored, stored, left alone --------------------------------------------


def test_the_same_prefix_is_restored_and_only_the_suffix_prefilled() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    first = decide(backend, cache, TASK, SCREEN)
    backend.calls.clear()
    second = decide(backend, cache, TASK, "Screen: Network. Options: A) Wi-Fi B) Mobile C) VPN.")
    n = first.n_stored
    assert work(backend) == [("load", n), ("prefill", n, second.n_prefilled)]
    assert (second.n_reused, second.n_stored, second.store_s) == (n, 0, 0.0)
    assert second.restore_s > 0.0
    assert (
        second.choice_logp == fresh(TASK, "Screen: Network. Options: A) Wi-Fi B) Mobile C) VPN.").choice_logp
    )


def test_a_grown_prefix_restores_the_last_one_prefills_the_difference_and_keeps_the_longer() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    first = decide(backend, cache, TASK, SCREEN)
    grown = TASK + "Opened Settings. "
    backend.calls.clear()
    second = decide(backend, cache, grown, "Screen: Network.")
    n1, n2 = first.n_stored, n_tokens(backend, "<u>" + grown) - 1
    assert work(backend) == [
        ("load", n1),
        ("prefill", n1, n2 - n1),
        ("save", n2),
        ("prefill", n2, second.n_tokens - n2),
    ]
    assert (second.n_reused, second.n_stored) == (n1, n2)
    assert [len(k.tokens) for k in cache.kept()] == [n2]
    assert second.choice_logp == fresh(grown, "Screen: Network.").choice_logp


def test_an_unrelated_prefix_is_prefilled_whole_and_replaces_the_kept_state() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    decide(backend, cache, TASK, SCREEN)
    backend.calls.clear()
    other = decide(backend, cache, "Task: call Mum. ", SCREEN)
    assert [c[0] for c in work(backend)] == ["reset", "prefill", "save", "prefill"]
    assert other.n_reused == 0
    assert cache.kept()[0].tokens == tuple(backend.tokenize("<u>Task: call Mum. ", special=True)[:-1])


def test_a_kept_prefix_longer_than_the_requests_prefix_is_not_restored() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    decide(backend, cache, TASK + "Opened Settings. ", SCREEN)
    shorter = decide(backend, cache, TASK, SCREEN)
    assert shorter.n_reused == 0 and shorter.n_stored > 0


def test_opting_out_prefills_whole_and_leaves_the_kept_state_as_it_was() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    first = decide(backend, cache, TASK, SCREEN)
    kept = cache.kept()
    backend.calls.clear()
    whole = decide(backend, cache, TASK + "Opened Settings. ", SCREEN, reuse=False)
    assert work(backend) == [("reset",), ("prefill", 0, whole.n_tokens)]
    assert cache.kept() == kept and whole.n_stored == 0
    assert whole.prefix_state_mib == first.prefix_state_mib > 0
    assert decide(backend, cache, TASK, SCREEN).n_reused == first.n_stored


def test_with_the_prefix_cache_off_nothing_is_ever_saved_or_restored() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    for suffix in (SCREEN, "Screen: Network.", SCREEN):
        result = decide(backend, cache, TASK, suffix, config=OFF)
        assert (result.n_reused, result.n_stored, result.prefix_state_mib) == (0, 0, 0.0)
    assert {c[0] for c in work(backend)} == {"reset", "prefill"}
    assert len(cache) == 0


def test_prefix_state_mib_is_what_the_kept_states_hold() -> None:
    backend = ScriptedDecideBackend(state_pad=3 * 1024 * 1024)
    cache = LastPrefixCache()
    result = decide(backend, cache, TASK, SCREEN)
    assert result.prefix_state_mib == pytest.approx(3.0 + 4 * result.n_stored / 2**20)
    assert result.prefix_state_mib == cache.nbytes / 2**20


def test_clearing_the_cache_makes_the_next_decision_prefill_whole() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    decide(backend, cache, TASK, SCREEN)
    cache.clear()
    again = decide(backend, cache, TASK, SCREEN)
    assert again.n_reused == 0 and again.n_stored > 0


AGENT = [
    (TASK, SCREEN),
    (TASK, "Screen: Settings, scrolled."),
    (TASK + "Opened Settings. ", "Screen: Network."),
    (TASK + "Opened Settings. ", "Screen: Network, scrolled."),
    (TASK + "Opened Settings. Opened Network. ", "Screen: Wi-Fi."),
    ("Task: call Mum. ", "Screen: Home."),
]


def test_a_sequence_of_decisions_with_the_kept_state_equals_each_computed_afresh() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    results = [decide(backend, cache, prefix, suffix) for prefix, suffix in AGENT]
    assert [r.n_reused > 0 for r in results] == [False, True, True, True, True, False]
    for (prefix, suffix), result in zip(AGENT, results, strict=True):
        reference = fresh(prefix, suffix)
        assert (result.best, result.choice_logp, result.n_tokens) == (
            reference.best,
            reference.choice_logp,
            reference.n_tokens,
        )


# -- failures ---------------------------------------------------------------------------------


def test_a_state_that_does_not_load_is_dropped_and_the_decision_prefilled_whole() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    first = decide(backend, cache, TASK, SCREEN)
    old = cache.kept()[0]
    backend.fail_load = True
    backend.calls.clear()
    second = decide(backend, cache, TASK, "Screen: Network.")
    assert work(backend)[:2] == [("load", first.n_stored), ("prefill", 0, first.n_stored)]
    assert second.n_reused == 0 and second.n_prefilled == second.n_tokens
    assert second.choice_logp == fresh(TASK, "Screen: Network.").choice_logp
    assert cache.kept()[0] is not old and second.n_stored == first.n_stored  # stored afresh
    backend.fail_load = False
    assert decide(backend, cache, TASK, SCREEN).n_reused == first.n_stored


def test_a_state_that_does_not_load_is_not_kept_beside_the_new_one() -> None:
    backend = ScriptedDecideBackend()
    cache = LruPrefixCache(2)
    decide(backend, cache, TASK, SCREEN)
    backend.fail_load = True
    grown = decide(backend, cache, TASK + "Opened Settings. ", "Screen: Network.")
    assert [len(k.tokens) for k in cache.kept()] == [grown.n_stored]


def test_a_state_that_cannot_be_copied_still_answers_and_keeps_the_old_state() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    first = decide(backend, cache, TASK, SCREEN)
    kept = cache.kept()
    backend.fail_save = True
    grown = decide(backend, cache, TASK + "Opened Settings. ", "Screen: Network.")
    assert grown.n_stored == 0 and grown.n_reused == first.n_stored
    assert cache.kept() == kept
    assert grown.choice_logp == fresh(TASK + "Opened Settings. ", "Screen: Network.").choice_logp


@pytest.mark.parametrize("failing_piece", [1, 2], ids=["prefix-piece", "suffix-piece"])
def test_a_failed_prefill_raises_empties_the_memory_and_stores_nothing(failing_piece: int) -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    backend.fail_prefill = failing_piece
    with pytest.raises(DecodeError, match="scripted failure"):
        decide(backend, cache, TASK, SCREEN)
    assert backend.memory == [] and len(cache) == 0
    assert backend.calls[-1] == ("reset",)
    backend.fail_prefill = None
    after = decide(backend, cache, TASK, SCREEN)
    assert after.choice_logp == fresh(TASK, SCREEN).choice_logp and after.n_stored > 0


def test_a_failure_after_a_restore_keeps_the_restored_state_for_the_next_decision() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    first = decide(backend, cache, TASK, SCREEN)
    kept = cache.kept()
    backend.fail_prefill = backend.n_prefill_calls + 1
    with pytest.raises(DecodeError):
        decide(backend, cache, TASK + "Opened Settings. ", "Screen: Network.")
    assert cache.kept() == kept and backend.memory == []
    again = decide(backend, cache, TASK, SCREEN)
    assert again.n_reused == first.n_stored and again.choice_logp == first.choice_logp


def test_a_cancelled_decision_stores_nothing_and_the_next_one_is_served() -> None:
    backend = ScriptedDecideBackend()
    cache = LastPrefixCache()
    backend.abort_prefill = 2  # after the prefix state was copied
    cut = decide(backend, cache, TASK, SCREEN)
    assert cut.cancelled and (cut.best, cut.choice_logp, cut.choice_p_renorm) == (-1, (), ())
    assert ("save", cut.n_prefilled) in backend.calls and len(cache) == 0
    assert backend.memory == [] and cut.prefix_state_mib == 0.0
    backend.abort_prefill = None
    after = decide(backend, cache, TASK, SCREEN)
    assert not after.cancelled and after.choice_logp == fresh(TASK, SCREEN).choice_logp


def test_the_fake_refuses_logits_it_did_not_compute() -> None:
    backend = ScriptedDecideBackend()
    with pytest.raises(ValueError, match="no logits"):
        backend.logits()
    backend.prefill([1, 2], 0)
    blob = backend.save_state()
    assert blob is not None and backend.load_state(blob)
    with pytest.raises(ValueError, match="no logits"):
        backend.logits()


# -- the K-slot LRU ---------------------------------------------------------------------------


def blob(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.uint8)


def test_two_agents_alternating_each_keep_their_state_with_two_slots_and_thrash_with_one() -> None:
    agents = [("Task: turn on Wi-Fi. ", "Screen: Home."), ("Task: call Mum. ", "Screen: Home.")]
    for slots, reused in ((2, [False, False, True, True, True, True]), (1, [False] * 6)):
        backend = ScriptedDecideBackend()
        cache = new_prefix_cache(slots)
        results = [decide(backend, cache, *agents[i % 2]) for i in range(6)]
        assert [r.n_reused > 0 for r in results] == reused
        assert [r.choice_logp for r in results[2:]] == [r.choice_logp for r in results[:4]]


def test_lookup_finds_the_longest_kept_state_the_prefix_extends() -> None:
    cache = LruPrefixCache(3)
    cache.store([1, 2], blob(1))
    cache.store([1, 2, 3, 4], blob(2))
    cache.store([5], blob(3))
    assert cache.lookup([1, 2, 3, 4, 5]).tokens == (1, 2, 3, 4)  # type: ignore[union-attr]
    assert cache.lookup([1, 2, 3]).tokens == (1, 2)  # type: ignore[union-attr]
    assert cache.lookup([1]) is None and cache.lookup([]) is None
    assert cache.nbytes == 6


def test_a_lookup_makes_a_state_recent_and_the_least_recent_is_dropped() -> None:
    cache = LruPrefixCache(2)
    cache.store([1], blob(1))
    cache.store([2], blob(1))
    cache.lookup([1, 9])
    cache.store([3], blob(1))
    assert [k.tokens for k in cache.kept()] == [(1,), (3,)]
    cache.store([1], blob(5))  # the same tokens replace their state
    assert [k.tokens for k in cache.kept()] == [(3,), (1,)] and cache.nbytes == 6
    cache.discard([3])
    assert [k.tokens for k in cache.kept()] == [(1,)]


def test_the_cache_factory_and_its_refusals() -> None:
    assert type(new_prefix_cache(1)) is LastPrefixCache and new_prefix_cache(1).slots == 1
    assert new_prefix_cache(4).slots == 4
    with pytest.raises(ConfigError, match="at least 1"):
        LruPrefixCache(0)
    with pytest.raises(ValueError, match="at least one token"):
        LruPrefixCache(1).store([], blob(1))


_tokens = st.lists(st.integers(0, 2), min_size=0, max_size=4)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), _tokens.filter(bool), st.integers(0, 8)),
        st.tuples(st.just("lookup"), _tokens, st.just(0)),
        st.tuples(st.just("discard"), _tokens, st.just(0)),
        st.tuples(st.just("clear"), st.just([]), st.just(0)),
    ),
    max_size=40,
)


@given(slots=st.integers(1, 4), ops=_ops)
def test_the_lru_behaves_like_a_plain_recency_list(slots: int, ops: list[tuple[str, list[int], int]]) -> None:
    cache = LruPrefixCache(slots)
    model: list[tuple[tuple[int, ...], int]] = []  # (tokens, nbytes), least recent first
    for op, tokens, size in ops:
        key = tuple(tokens)
        if op == "store":
            model = [e for e in model if e[0] != key] + [(key, size)]
            model = model[-slots:]
            cache.store(tokens, blob(size))
        elif op == "lookup":
            hits = [e for e in model if key[: len(e[0])] == e[0]]
            best = max(hits, key=lambda e: len(e[0])) if hits else None
            if best is not None:
                model = [e for e in model if e is not best] + [best]
            got = cache.lookup(tokens)
            assert (got.tokens if got else None) == (best[0] if best else None)
        elif op == "discard":
            model = [e for e in model if e[0] != key]
            cache.discard(tokens)
        else:
            model = []
            cache.clear()
        cache.check_valid()
        assert [(k.tokens, k.nbytes) for k in cache.kept()] == model
        assert cache.nbytes == sum(size for _, size in model)
