"""Slots that keep their KV (``-np N``, ``Session.run_parallel``) on real sessions: two
conversations served two at a time, turn after turn, each find their own slot again (the
similarity rule) and prefill only what they added, across runs too (the server's worker
starts a run per burst of requests), and answer with the tokens of a session whose slots
never reuse a prefix, resident and streamed; a conversation served alone through its kept
slot answers bit for bit (tokens and log-probabilities) as a fresh server; a generate or a
decision between runs takes the context and the next run starts empty."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress, RunResult
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.service.parallel_jobs import ParallelEntry

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, n_seq_max=2)
SYSTEM = ChatMessage("system", "You are a coding agent. Tools: read_file, write_file, list_dir, run_tests.")
ROUNDS = [{"a": "read main.py", "b": "list the files"}, {"a": "now edit it", "b": "and count them"}]


@attrs.define
class Collect:
    results: list[RunResult] = attrs.Factory(list)

    def progress(self, p: Progress) -> None:
        pass

    def wants_stop(self) -> bool:
        return False

    def done(self, result: RunResult) -> None:
        self.results.append(result)

    def failed(self, error: BaseException) -> None:
        raise AssertionError(f"refused: {error}")


def run_round(session: Session, entries: Sequence[ParallelEntry]) -> None:
    """One run of ``run_parallel`` serving ``entries`` (what the server does per burst)."""
    pending = list(entries)

    def take(idle: bool) -> list[ParallelEntry]:
        out, pending[:] = list(pending), []
        return out

    session.run_parallel(take)


def conversation_rounds(session: Session) -> dict[str, list[RunResult]]:
    """Each round's two requests, each carrying its conversation, in one run per round."""
    return conversation_rounds_of(functools.partial(run_round, session), ROUNDS)


def conversation_rounds_of(
    serve: Callable[[list[ParallelEntry]], None], rounds: Sequence[dict[str, str]]
) -> dict[str, list[RunResult]]:
    """Each round's requests, each carrying its conversation, served by ``serve`` (one call
    a round)."""
    histories = {who: [SYSTEM] for who in rounds[0]}
    results: dict[str, list[RunResult]] = {who: [] for who in rounds[0]}
    for prompts in rounds:
        sinks = {who: Collect() for who in prompts}
        entries = [
            ParallelEntry(
                GenerateRequest(prompt, n_predict=6, logprobs=2), sinks[who], history=list(histories[who])
            )
            for who, prompt in prompts.items()
        ]
        serve(entries)
        for who, prompt in prompts.items():
            result = sinks[who].results[0]
            results[who].append(result)
            histories[who] += [ChatMessage("user", prompt), ChatMessage("assistant", result.text)]
    return results


def config(path: Path, streamed: bool, similarity: float, profile: Path | None = None) -> SessionConfig:
    """``profile``: streamed, learn the usage profile there and start warm from it (the CLI's
    and the server's default, ``--profile auto``)."""
    stream = StreamConfig(
        enabled=streamed, cache_mb=2, governor="off", profile="off" if profile is None else str(profile)
    )
    return SessionConfig(
        model_path=path, context=PARAMS, chat=True, stream=stream, slot_similarity=similarity
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss"])
def test_each_conversation_finds_its_slot_again_and_prefills_only_what_it_added(
    tiny_model_path: TinyModel, name: str, streamed: bool
) -> None:
    path = tiny_model_path(name)
    with Session.open(config(path, streamed, 0.1)) as s:
        kept = conversation_rounds(s)
    with Session.open(config(path, streamed, 1.0)) as s:  # never a kept prefix: today's way
        plain = conversation_rounds(s)
    for who in "ab":
        first, second = kept[who]
        assert [r.tokens for r in kept[who]] == [r.tokens for r in plain[who]], who
        # the same to the last bits but theirs: two conversations sharing steps land their cells
        # where the other's leave room, and a unified KV cache's sums over cells then round
        # otherwise (measured up to 5e-5; a fresh server serving them together does the same)
        for k, p in zip(kept[who], plain[who], strict=True):
            diffs = [
                abs(a.chosen.logprob - b.chosen.logprob) for a, b in zip(k.logprobs, p.logprobs, strict=True)
            ]
            assert max(diffs) < 1e-4, (who, diffs)
        assert first.n_prompt == plain[who][0].n_prompt  # the first turn: nothing its own held
        whole = plain[who][1].n_prompt
        # the second: its slot kept its first prompt (the reply's cells cut: computed again
        # with the new message, in a batch, as a fresh server computes them)
        assert second.n_prompt == whole - first.n_prompt, (who, second, whole)


def test_a_generate_between_runs_takes_the_context_and_the_next_run_starts_empty(
    tiny_model_path: TinyModel,
) -> None:
    path = tiny_model_path("qwen3moe")
    with Session.open(config(path, False, 0.1)) as s:
        sink = Collect()
        run_round(s, [ParallelEntry(GenerateRequest("read main.py", n_predict=6), sink, history=[SYSTEM])])
        s.generate(GenerateRequest("something else", n_predict=4))
        again = Collect()
        history = [
            SYSTEM,
            ChatMessage("user", "read main.py"),
            ChatMessage("assistant", sink.results[0].text),
        ]
        run_round(s, [ParallelEntry(GenerateRequest("now edit it", n_predict=6), again, history=history)])
    with Session.open(config(path, False, 0.1)) as fresh:
        reference = Collect()
        run_round(
            fresh, [ParallelEntry(GenerateRequest("now edit it", n_predict=6), reference, history=history)]
        )
    assert again.results[0].n_prompt == reference.results[0].n_prompt  # nothing kept
    assert again.results[0].tokens == reference.results[0].tokens


@attrs.define
class Paced:
    """A sink that records at which step of the run each of its tokens came."""

    clock: list[int]
    at: list[int] = attrs.Factory(list)
    results: list[RunResult] = attrs.Factory(list)

    def progress(self, p: Progress) -> None:
        self.at.append(self.clock[0])

    def wants_stop(self) -> bool:
        return False

    def done(self, result: RunResult) -> None:
        self.results.append(result)

    def failed(self, error: BaseException) -> None:
        raise AssertionError(f"refused: {error}")


LONG = " ".join(f"line {i}: def f{i}(x): return x * {i}" for i in range(9))


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_a_long_prompt_joins_in_chunks_and_the_running_stream_is_never_left_out(
    tiny_model_path: TinyModel, streamed: bool
) -> None:
    """A stream runs; a prompt of several hundred tokens joins (``-b`` 64 a step): the stream
    gets a token at every step while the prompt is prefilled in chunks beside it, and both
    replies are the tokens each gets alone."""
    path = tiny_model_path("qwen3moe")
    clock = [0]
    stream, joiner = Paced(clock), Paced(clock)
    runner = ParallelEntry(GenerateRequest("Tell a long story", n_predict=40), stream, history=[SYSTEM])
    long = ParallelEntry(GenerateRequest(LONG, n_predict=4), joiner, history=[SYSTEM])
    with Session.open(config(path, streamed, 0.1)) as s:
        prefills: list[int] = []  # decodes of a prompt of their own (the stream left out)
        own = s.ctx.decode

        def decode(tokens: Sequence[int], start_pos: int, **kw: object) -> None:
            prefills.append(len(tokens))
            own(tokens, start_pos, **kw)  # type: ignore[arg-type]

        def take(idle: bool) -> list[ParallelEntry]:
            clock[0] += 1
            return {1: [runner], 4: [long]}.get(clock[0], [])

        s.ctx.decode = decode  # type: ignore[method-assign]
        s.run_parallel(take)
        assert prefills == []  # no prompt had a decode of its own: each joined in steps
        n_long = s.model.tokenize_prompt(s.template.render([SYSTEM, ChatMessage("user", LONG)]))
    assert len(n_long) > 3 * PARAMS.n_batch
    joined = 4
    during = [t for t in stream.at if joined <= t <= joiner.at[0]]
    assert len(during) == joiner.at[0] - joined + 1, (stream.at, joiner.at)  # one a step
    assert joiner.at[0] - joined >= len(n_long) // PARAMS.n_batch  # its prompt took several steps
    for entry, sink in ((runner, stream), (long, joiner)):
        with Session.open(config(path, streamed, 0.1)) as alone:
            reference = Collect()
            run_round(alone, [attrs.evolve(entry, sink=reference)])
        assert sink.results[0].tokens == reference.results[0].tokens


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_more_conversations_than_slots_come_back_through_the_prompt_cache(
    tiny_model_path: TinyModel, streamed: bool
) -> None:
    """Three conversations on two slots, two rounds: a conversation whose slot was taken
    restores its state from the prompt cache into whichever slot it gets, and prefills only
    what it added; the tokens are those of the same session without the cache."""
    path = tiny_model_path("qwen3moe")
    prompts = [{c: f"task {c}: read file {c}.py" for c in "abc"}, {c: f"now fix {c}" for c in "abc"}]

    def rounds(cache_mb: int) -> tuple[dict[str, list[RunResult]], int]:
        with Session.open(attrs.evolve(config(path, streamed, 0.1), cache_ram_mb=cache_mb)) as s:
            histories = {c: [SYSTEM] for c in "abc"}
            results: dict[str, list[RunResult]] = {c: [] for c in "abc"}
            for round_prompts in prompts:
                sinks = {c: Collect() for c in "abc"}
                entries = [
                    ParallelEntry(GenerateRequest(p, n_predict=6), sinks[c], history=list(histories[c]))
                    for c, p in round_prompts.items()
                ]
                run_round(s, entries)
                for c, p in round_prompts.items():
                    result = sinks[c].results[0]
                    results[c].append(result)
                    histories[c] += [ChatMessage("user", p), ChatMessage("assistant", result.text)]
            restored = s.prompt_cache.counters.restored if s.prompt_cache is not None else 0
        return results, restored

    cached, restored = rounds(64)
    plain, none = rounds(0)
    assert restored >= 1 and none == 0
    for c in "abc":
        assert [r.tokens for r in cached[c]] == [r.tokens for r in plain[c]], c
    second = [cached[c][1] for c in "abc"]
    assert sum(r.n_restored > 0 for r in second) == restored
    assert all(r.n_prompt < plain[c][1].n_prompt for c, r in zip("abc", second, strict=True))


def in_fresh_sessions(
    path: Path, streamed: bool, profile: Path | None = None
) -> Callable[[list[ParallelEntry]], None]:
    """Serving each round in a session of its own (nothing held): what a fresh server answers."""

    def serve(entries: list[ParallelEntry]) -> None:
        with Session.open(config(path, streamed, 0.1, profile)) as s:
            run_round(s, entries)

    return serve


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss"])
def test_a_conversation_back_in_its_kept_slot_answers_bit_for_bit_as_a_fresh_server(
    tiny_model_path: TinyModel, name: str, streamed: bool, tmp_path: Path
) -> None:
    """A slot keeps its prompt and cuts its reply's cells (computed one per step; the next
    turn computes them in a batch, as a fresh server does): the returning turn's tokens and
    log-probabilities are the fresh server's to the last bit, and it prefilled only its
    reply and its new message. Streamed as the server's defaults run: the kept session learns
    the usage profile and every fresh one starts warm from it."""
    path = tiny_model_path(name)
    lone = [{"a": r["a"]} for r in ROUNDS]
    profile = tmp_path / "profile.json" if streamed else None
    with Session.open(config(path, streamed, 0.1, profile)) as s:
        kept = conversation_rounds_of(functools.partial(run_round, s), lone)
    assert profile is None or profile.is_file()
    fresh = conversation_rounds_of(in_fresh_sessions(path, streamed, profile), lone)
    assert [r.tokens for r in kept["a"]] == [r.tokens for r in fresh["a"]]
    assert [r.logprobs for r in kept["a"]] == [r.logprobs for r in fresh["a"]]
    first, second = kept["a"]
    assert second.n_prompt == fresh["a"][1].n_prompt - first.n_prompt  # its first prompt reused
