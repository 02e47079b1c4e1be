"""The prompt cache (``--cache-ram``): its policy (``PromptCache``: the longest kept prefix,
one state per conversation, least recently used first within a byte limit) and the engine's
use of it (two conversations taking turns over one context cost only their new tokens),
over the scripted backend (its state is its context's tokens)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_session_engine_history import TinyTemplate, spell  # rootdir-relative, as the gates do

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.prompt_cache import PromptCache, cache_ram_bytes, follow_budget
from bmoe.service.session_engine import EngineDefaults, SessionEngine
from bmoe.testing.fake_backend import ScriptedGenerateBackend


def blob(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.uint8)


def test_the_longest_kept_prefix_leaving_one_token_to_prefill() -> None:
    cache = PromptCache(None)
    cache.store([1, 2], blob(4))
    cache.store([7, 8, 9], blob(4))
    found = cache.lookup([1, 2, 3])
    assert found is not None and (found.kept.tokens, found.shared, found.cut) == ((1, 2), 2, False)
    found = cache.lookup([1, 2])  # the last token must be prefilled (its logits): cut back
    assert found is not None and found.shared == 1 and found.cut
    assert cache.lookup([1, 2], whole=True) is None  # ... which a recurrent memory cannot
    assert cache.lookup([1, 2, 3], better_than=2) is None  # keeps no more than the context
    found = cache.lookup([7, 8, 9, 1])
    assert found is not None and (found.kept.tokens, found.shared) == ((7, 8, 9), 3)
    found = cache.lookup([7, 8, 5])  # shares two tokens: restored, then cut back to them
    assert found is not None and (found.kept.tokens, found.shared, found.cut) == ((7, 8, 9), 2, True)


def test_a_conversation_keeps_one_state_its_latest() -> None:
    cache = PromptCache(None)
    cache.store([1, 2], blob(4))
    cache.store([1, 2, 3, 4], blob(4))
    cache.store([1, 5], blob(4))  # another branch: kept beside it
    assert [k.tokens for k in cache.kept()] == [(1, 2, 3, 4), (1, 5)]
    assert cache.counters.superseded == 1
    cache.check_valid()


def test_least_recently_used_states_go_first_and_never_past_the_limit() -> None:
    cache = PromptCache(10)
    cache.store([1], blob(4))
    cache.store([2], blob(4))
    assert cache.lookup([1, 0]) is not None  # [1] is now the most recent
    cache.store([3], blob(4))
    assert [k.tokens for k in cache.kept()] == [(1,), (3,)]
    assert cache.counters.evicted == 1
    assert not cache.store([4], blob(11)) and cache.counters.refused == 1  # alone past the limit
    assert cache.set_limit(5) == 4 and [k.tokens for k in cache.kept()] == [(3,)]  # dropped whole
    assert cache.nbytes <= 5
    cache.check_valid()


def test_cache_ram_flag_values() -> None:
    assert (cache_ram_bytes(0), cache_ram_bytes(-1), cache_ram_bytes(2)) == (0, None, 2 << 20)
    with pytest.raises(ValueError):
        cache_ram_bytes(-2)


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["store", "lookup", "limit"]),
            st.lists(st.integers(1, 3), min_size=1, max_size=5),
            st.integers(0, 12),
        ),
        max_size=40,
    )
)
def test_any_sequence_of_operations_keeps_the_invariants(ops: list[tuple[str, list[int], int]]) -> None:
    cache = PromptCache(12)
    for op, tokens, n in ops:
        if op == "store":
            cache.store(tokens, blob(n))
        elif op == "lookup":
            found = cache.lookup(tokens, better_than=n % 3)
            if found is not None:
                shared = found.shared
                assert n % 3 < shared < len(tokens) and shared <= len(found.kept.tokens)
                assert tuple(tokens[:shared]) == found.kept.tokens[:shared]
                assert found.cut == (shared < len(found.kept.tokens))
        else:
            cache.set_limit(n)
        cache.check_valid()


SYSTEM = ChatMessage("system", "a long shared system prompt and tool list")


def two_conversations(cache: PromptCache | None) -> tuple[list[int], list[int], ScriptedGenerateBackend]:
    """A1, B1, A2, B2 over one engine, each request carrying its conversation: the tokens each
    turn prefilled, the replies, and the backend."""
    backend = ScriptedGenerateBackend(512, spell("ok"))  # type: ignore[arg-type]
    eng = SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=True, n_predict=8), prompt_cache=cache)
    a: list[ChatMessage] = [SYSTEM]
    b: list[ChatMessage] = [SYSTEM]
    prefilled, restored = [], []
    for history, prompt in [(a, "read main.py"), (b, "list files"), (a, "now edit it"), (b, "and count")]:
        result = eng.generate(GenerateRequest(prompt, clear_kv=False), history=list(history))
        history += [ChatMessage("user", prompt), ChatMessage("assistant", result.text)]
        prefilled.append(result.n_prompt)
        restored.append(result.n_restored)
    return prefilled, restored, backend


def test_two_conversations_taking_turns_cost_only_their_new_tokens() -> None:
    cold, cold_restored, plain = two_conversations(None)
    warm, restored, backend = two_conversations(PromptCache(None))
    assert cold_restored == [0, 0, 0, 0]
    # each conversation's second turn prefills only what it added: its last answer's end
    # (the template's "</a>") and the new message
    assert warm[:2] == cold[:2]
    assert warm[2] == len("</a><u>now edit it</u><a>")
    assert warm[3] == len("</a><u>and count</u><a>")
    assert restored[2] > 0 and restored[3] > 0 and warm[2] < cold[2] and warm[3] < cold[3]
    assert backend.loads == 2 and backend.saves == 3  # A after A1, B after B1, A after A2
    assert backend.context == plain.context  # the same conversation, token for token


def test_a_refused_state_is_forgotten_and_the_prompt_prefilled_whole() -> None:
    cache = PromptCache(None)
    backend = ScriptedGenerateBackend(512, spell("ok"))  # type: ignore[arg-type]

    def refuse(blob: np.ndarray) -> bool:
        backend.context.clear()  # as the port says: False leaves the context empty
        return False

    backend.load_state = refuse  # type: ignore[method-assign]
    eng = SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=True, n_predict=8), prompt_cache=cache)
    eng.generate(GenerateRequest("one", clear_kv=False), history=[SYSTEM])
    eng.generate(GenerateRequest("two", clear_kv=False), history=[])
    result = eng.generate(
        GenerateRequest("again", clear_kv=False),
        history=[SYSTEM, ChatMessage("user", "one"), ChatMessage("assistant", "ok")],
    )
    assert result.n_restored == 0 and len(cache) == 1  # the refused one was discarded, B kept


def test_the_governor_s_shrink_lowers_the_limit_below_what_is_held_and_a_growth_gives_it_back() -> None:
    cache = PromptCache(100)
    for key in ([1], [2], [3]):
        cache.store(key, blob(20))
    assert follow_budget(cache, 100, before=1000, after=970) == 40  # 30 below 60 held: two go
    assert cache.limit_bytes == 30 and len(cache) == 1
    assert follow_budget(cache, 100, before=970, after=1000) == 0 and cache.limit_bytes == 100


def test_named_conversations_each_continue_where_they_left_and_restore_their_state() -> None:
    backend = ScriptedGenerateBackend(512, spell("ok"))  # type: ignore[arg-type]
    cache = PromptCache(None)
    eng = SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=True, n_predict=8), prompt_cache=cache)
    for name, prompt in [("a", "read main.py"), ("b", "list files"), ("a", "now edit it")]:
        result = eng.generate(GenerateRequest(prompt, clear_kv=False, conversation=name))
    assert bytes(backend.context).decode() == "<u>read main.py</u><a>ok</a><u>now edit it</u><a>ok"
    assert result.n_restored == len("<u>read main.py</u><a>ok")  # a's own state came back
    assert result.n_prompt == len("</a><u>now edit it</u><a>")
    assert eng.conversations() == ["a", None, "b"]
    assert [m.content for m in eng.history] == ["read main.py", "ok", "now edit it", "ok"]
