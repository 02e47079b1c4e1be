"""The prompt cache (``--cache-ram``) on real sessions: two conversations taking turns over
one context (what ``-np 1`` serves when an agent and its subagent interleave) each restore
their own state when they come back and prefill only their new tokens, and every answer is
the one a fresh session serving that conversation alone gives (tokens and log-probabilities
bit for bit; a sliding-window model's log-probabilities to 1e-6), resident and streamed,
warm from the usage profile too, on a plain attention model, a hybrid (recurrent) one whose
memory cannot be trimmed and a sliding-window one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.client import SessionClient
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, RunResult, TokenLogprob
from bmoe.domain.streaming import StreamConfig
from bmoe.domain.streaming.governor import MemoryReading
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
SYSTEM = ChatMessage("system", "You are a coding agent. Tools: read_file, write_file, list_dir, run_tests.")
TURNS = [("a", "read main.py"), ("b", "list the files"), ("a", "now edit it"), ("b", "and count them")]


def config(path: Path, cache_ram_mb: int, streamed: bool, profile: str = "off") -> SessionConfig:
    stream = StreamConfig(enabled=streamed, cache_mb=2, governor="off", profile=profile)
    return SessionConfig(model_path=path, context=PARAMS, chat=True, stream=stream, cache_ram_mb=cache_ram_mb)


def ask(session: Session, history: list[ChatMessage], prompt: str) -> RunResult:
    request = GenerateRequest(prompt, n_predict=6, clear_kv=False, logprobs=2)
    result = session.generate(request, history=list(history))
    history += [ChatMessage("user", prompt), ChatMessage("assistant", result.text, result.reasoning)]
    return result


def close(a: tuple[TokenLogprob, ...], b: tuple[TokenLogprob, ...], tolerance: float) -> bool:
    """The same choices, log-probabilities within ``tolerance``."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        pairs = [(x.chosen, y.chosen), *zip(x.top, y.top, strict=True)]
        if len(x.top) != len(y.top) or any(
            p.token != q.token or abs(p.logprob - q.logprob) > tolerance for p, q in pairs
        ):
            return False
    return True


def replay(session: Session, turns: list[tuple[str, str]]) -> list[RunResult]:
    """Serve ``turns`` (conversation, prompt) in order on ``session``; their results."""
    histories: dict[str, list[ChatMessage]] = {"a": [SYSTEM], "b": [SYSTEM]}
    return [ask(session, histories[who], prompt) for who, prompt in turns]


def alone(i: int) -> list[tuple[str, str]]:
    """The turns a session without a prompt cache serves so that turn ``i`` finds its
    conversation's own state in the context: every turn up to that conversation's previous
    one, then turn ``i`` (nothing of the other conversation in between)."""
    who = TURNS[i][0]
    previous = [j for j in range(i) if TURNS[j][0] == who]
    return [*TURNS[: previous[-1] + 1 if previous else i], TURNS[i]]


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe", "gpt-oss"])
def test_conversations_taking_turns_answer_as_if_each_had_the_context_alone(
    tiny_model_path: TinyModel, name: str, streamed: bool, tmp_path: Path
) -> None:
    """The reference for each turn is a fresh session without a prompt cache whose context
    holds that turn's conversation as it left it (``alone``): the same tokens, prefilled in
    the same pieces. Tokens and log-probabilities are compared bit for bit, but for the
    sliding-window model's log-probabilities (to 1e-6; measured 2026-12-04: 6e-9 at most):
    its window's cache is a ring whose cells a long history has moved round, while a
    restored state (``llama_state_seq_set_data``) lays its cells out from the ring's start,
    and attention sums over cells in that order (the design's "compare like with like": a
    restored state is exact, another layout of the same tokens is not)."""
    path = tiny_model_path(name)
    profile = str(tmp_path / "profile.json") if streamed else "off"
    with Session.open(config(path, 64, streamed, profile)) as s:
        got = replay(s, TURNS)
        assert s.prompt_cache is not None
        assert s.prompt_cache.counters.restored == 2 and s.prompt_cache.nbytes <= 64 << 20
    with Session.open(config(path, 0, streamed, profile)) as plain:
        without = replay(plain, TURNS)
    for i, result in enumerate(got):
        with Session.open(config(path, 0, streamed, profile)) as fresh:  # streamed: warm from the profile
            reference = replay(fresh, alone(i))[-1]
        assert result.tokens == reference.tokens, i
        assert close(result.logprobs, reference.logprobs, 1e-6 if name == "gpt-oss" else 0.0), i
        assert result.n_prompt == reference.n_prompt, i  # only what the conversation added
        assert (result.n_restored > 0) == (i >= 2), (i, result)
        assert result.tokens == without[i].tokens, i
    assert [r.n_restored for r in without] == [0, 0, 0, 0]
    assert all(got[i].n_prompt < without[i].n_prompt for i in (2, 3))  # today: the whole history


def test_a_cache_at_its_limit_drops_whole_states_and_stays_within_it(tiny_model_path: TinyModel) -> None:
    path = tiny_model_path("qwen3moe")
    histories = {who: [ChatMessage("system", f"conversation {who} " * 4)] for who in "abcde"}
    with Session.open(config(path, -1, False)) as s:
        cache = s.prompt_cache
        assert cache is not None
        for who in "abc":
            ask(s, histories[who], "hello")
        assert len(cache) == 2  # a and b kept; c holds the context
        sizes = [kept.nbytes for kept in cache.kept()]
        cache.set_limit(max(sizes) + min(sizes) // 2)  # room for one state only
        assert len(cache) == 1 and cache.counters.evicted == 1
        for who in "dea":
            ask(s, histories[who], "hello")
            cache.check_valid()
            assert cache.nbytes <= cache.limit_bytes
        assert cache.counters.evicted >= 3


def test_under_memory_pressure_the_kept_conversations_give_their_room_back(
    tiny_model_path: TinyModel,
) -> None:
    """The session's governor (``--cache-mb auto``) lowers the prompt cache's limit with the
    expert cache's budget (whole states dropped) and gives the configured limit back when
    memory is free again."""
    path = tiny_model_path("qwen3moe")
    stream = StreamConfig(enabled=True, cache_mb=2, governor="on")
    with Session.open(
        SessionConfig(model_path=path, context=PARAMS, chat=True, stream=stream, cache_ram_mb=64)
    ) as s:
        assert s.governor is not None and s.prompt_cache is not None
        s.governor.close()  # driven by hand below, from scripted readings
        for who in "abc":
            ask(s, [ChatMessage("system", f"conversation {who}")], "hello")
        assert len(s.prompt_cache) == 2
        policy = s.governor.policy
        policy.config = attrs.evolve(policy.config, floor_bytes=0, grow_after=1, cooldown=0)
        s.governor.probe = Readings([10, 4000])  # type: ignore[assignment]
        shrink = s.governor.step()
        assert shrink is not None and shrink.shrinks
        assert s.prompt_cache.limit_bytes is not None and s.prompt_cache.nbytes <= s.prompt_cache.limit_bytes
        assert len(s.prompt_cache) < 2
        grow = s.governor.step()
        assert grow is not None and not grow.shrinks and s.prompt_cache.limit_bytes == 64 << 20


class Readings:
    """Scripted memory readings: the MiB free at each."""

    def __init__(self, free_mib: list[int]) -> None:
        self.free = list(free_mib)

    def read(self) -> MemoryReading:
        mib = self.free.pop(0) if len(self.free) > 1 else self.free[0]
        return MemoryReading(room_bytes=mib << 20, usable_bytes=8 << 30, pressure_pct=None)


def test_the_line_protocol_keeps_named_conversations_and_restores_their_state(
    tiny_model_path: TinyModel,
) -> None:
    """``--session --cache-ram``: two named conversations taking turns; each second turn
    restores its own state (``n_restored`` in ``BMOE_DONE``) and writes what a session
    holding that conversation alone writes."""
    model = str(tiny_model_path("qwen3moe"))
    args = [
        "-m",
        model,
        "--session",
        "--chatml",
        "--moe-stream",
        "--cache-mb",
        "2",
        "--temp",
        "0",
        "-c",
        "512",
    ]
    turns = [("a", "read main.py"), ("b", "list the files"), ("a", "now edit it"), ("b", "and count them")]
    with SessionClient([*args, "--cache-ram", "64"]) as client:
        done = [client.generate(p, n_predict=6, clear_kv=False, conversation=c) for c, p in turns]
    assert [d.n_restored > 0 for d in done] == [False, False, True, True]
    for who in "ab":
        with SessionClient([*args, "--cache-ram", "0"]) as alone:
            expected = [alone.generate(p, n_predict=6, clear_kv=False) for c, p in turns if c == who]
        got = [d for d, (c, _) in zip(done, turns, strict=True) if c == who]
        assert [d.text for d in got] == [e.text for e in expected], who
        assert got[1].n_prompt == expected[1].n_prompt, who  # only what it added
