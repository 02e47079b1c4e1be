"""Prompt-sized ubatches (``StreamConfig.size_prompt_batch``, the command line's default
under ``--moe-stream`` with ``-b`` unsaid): the batch chosen from the memory room, the
expert cache lending a prompt its room, llama.cpp's compute buffer given back after it.

- Streamed at the chosen batch equals resident at that batch bit for bit (tokens, the
  prefill's logits, the final logits): a prompt in one ubatch (the room holds the whole
  context), and a prompt over several ubatches (a small room, faked), each streamed as a
  user's sessions run (the first learns the usage profile, the second starts warm from it),
  with the fast path and the reference policy.
- The choice never exceeds the room: the compute buffer llama.cpp reserved at the chosen
  batch (not the extrapolation it was chosen by) fits the room the arithmetic gave it.
- The compute buffer's pages do go back: the process's resident memory drops after a long
  prompt when they are given back, and the next request is still bit for bit the resident one.
- While a prompt holds the cache's room the governor does not read (the prompt's memory was
  planned), and a budget set meanwhile is the one the prompt gives back to.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.streaming import MIB, StreamConfig
from bmoe.domain.streaming.governor import GovernorConfig, MemoryReading
from bmoe.domain.streaming.prefill_memory import PROMPT_BATCH_STEP
from bmoe.runtime import Session, SessionConfig, session_streaming
from bmoe.runtime.governor import CacheGovernor

TinyModelPath = Callable[..., Path]
N_CTX = 2048
GIVEN = ContextParams(n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=2)  # what the probe starts from
N_PREDICT = 6
TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the green "
    "forest where nobody can find it again. Later that evening the fox comes back, sits by "
    "the river and watches the water flow past the old stone bridge while the sun goes down. "
)


@attrs.frozen
class Outcome:
    tokens: tuple[int, ...]
    prefill_logits: npt.NDArray[np.float32]
    final_logits: npt.NDArray[np.float32]

    def same(self, other: Outcome) -> bool:
        return (
            self.tokens == other.tokens
            and np.array_equal(self.prefill_logits, other.prefill_logits)
            and np.array_equal(self.final_logits, other.final_logits)
        )


def text_of(n_repeats: int, seed: int = 0) -> str:
    return f"Note {seed}. " + TEXT * n_repeats


def outcome(s: Session, text: str) -> Outcome:
    first: list[npt.NDArray[np.float32]] = []

    def on_progress(p: Progress) -> None:
        if p.step == 1:
            first.append(s.last_logits())

    result = s.generate(GenerateRequest(text, n_predict=N_PREDICT), on_progress=on_progress)
    assert len(result.tokens) == N_PREDICT
    return Outcome(result.tokens, first[0], s.last_logits())


@functools.cache
def resident(path: Path, n_ubatch: int, texts: tuple[str, ...]) -> list[Outcome]:
    context = attrs.evolve(GIVEN, n_batch=n_ubatch, n_ubatch=n_ubatch)
    with Session.open(SessionConfig(model_path=path, context=context)) as s:
        return [outcome(s, t) for t in texts]


def stream_config(profile: Path, policy: str) -> StreamConfig:
    return StreamConfig(
        enabled=True, size_prompt_batch=True, governor="off", profile=str(profile), policy=policy
    )


def streamed(
    path: Path, profile: Path, policy: str, texts: tuple[str, ...]
) -> tuple[int, list[Outcome], int]:
    """The chosen batch, the outcomes, the prompts that borrowed the cache's room."""
    with Session.open(
        SessionConfig(model_path=path, context=GIVEN, stream=stream_config(profile, policy))
    ) as s:
        control = s.streaming
        assert control is not None and control.prompt_batch is not None, s.notes
        control.set_budget(6 * control.info.entry_bytes)  # a few entries: the prompt evicts
        got = [outcome(s, t) for t in texts]
        assert s.ctx.params.n_ubatch == s.config.context.n_ubatch == control.prompt_batch.tokens
        assert control.lending is not None
        lent = control.lending.lent_times
        if lent:
            assert control.compute_released_bytes > 0  # each prompt's buffer went back
        return control.prompt_batch.tokens, got, lent


@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_a_prompt_in_one_ubatch_of_the_chosen_size_equals_resident(
    tiny_model_path: TinyModelPath, tmp_path: Path, policy: str
) -> None:
    path = tiny_model_path("qwen3moe")
    texts = (text_of(12), text_of(14, seed=1))
    profile = tmp_path / "profile.json"
    for run in ("learns", "warm"):
        n_ubatch, got, lent = streamed(path, profile, policy, texts)
        assert n_ubatch == N_CTX, "the room holds the whole context's compute buffer here"
        assert lent == len(texts), run
        want = resident(path, n_ubatch, texts)
        assert all(g.same(w) for g, w in zip(got, want, strict=True)), run
    assert profile.is_file()


class SmallRoom:
    """A memory room that leaves the compute buffer ``tokens`` tokens' worth, from the
    figures a session with the machine's room found (dense, KV, layers, bytes a token)."""

    def __init__(self, path: Path, tokens: int) -> None:
        config = SessionConfig(
            model_path=path, context=GIVEN, stream=StreamConfig(enabled=True, size_prompt_batch=True)
        )
        with Session.open(config) as s:
            assert s.streaming is not None and s.streaming.prompt_batch is not None
            figures = s.streaming.prompt_batch.room
        held = figures.room_bytes - figures.compute_room_bytes()
        self.room_bytes = int(held + figures.compute_per_token * tokens)

    def read(self) -> MemoryRoom:
        return MemoryRoom(available_bytes=self.room_bytes)


@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_a_prompt_over_several_ubatches_of_a_small_room_equals_resident(
    tiny_model_path: TinyModelPath, tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_model_path("qwen3moe")
    room = SmallRoom(path, 200)
    monkeypatch.setattr(session_streaming, "ProcessMemoryRoom", lambda: room)
    texts = (text_of(12), text_of(5, seed=1))  # ~1,400 and ~580 tokens: 8 and 4 ubatches
    profile = tmp_path / "profile.json"
    for run in ("learns", "warm"):
        n_ubatch, got, lent = streamed(path, profile, policy, texts)
        assert n_ubatch == 192 and n_ubatch % PROMPT_BATCH_STEP == 0, n_ubatch
        assert lent == len(texts), run
        want = resident(path, n_ubatch, texts)
        assert all(g.same(w) for g, w in zip(got, want, strict=True)), run


def test_the_chosen_batch_never_takes_more_than_the_room_gave_it(
    tiny_model_path: TinyModelPath, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_model_path("qwen3moe")
    for tokens in (100, 700, 1500):
        room = SmallRoom(path, tokens)
        monkeypatch.setattr(session_streaming, "ProcessMemoryRoom", lambda room=room: room)
        config = SessionConfig(
            model_path=path, context=GIVEN, stream=stream_config(tmp_path / "p.json", "fast")
        )
        with Session.open(config) as s:
            assert s.streaming is not None and s.streaming.prompt_batch is not None
            batch = s.streaming.prompt_batch
            # what llama.cpp reserved at the chosen batch, against the room for it
            room_for_it = batch.room.compute_room_bytes(batch.layers)
            assert s.ctx.compute_buffer_bytes <= room_for_it, (tokens, batch.describe())
            # without flash attention the attention scores cut the batch: the line says what
            # -fa on would allow (a second probe), never chosen for the user
            assert s.ctx.params.flash_attn == "off"
            assert batch.with_flash is not None and batch.with_flash > batch.tokens, batch.describe()
            assert batch.tokens > tokens - 2 * PROMPT_BATCH_STEP, (tokens, batch.tokens)


def resident_kib() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4


def test_the_compute_buffer_goes_back_after_a_long_prompt(
    tiny_model_path: TinyModelPath, tmp_path: Path
) -> None:
    path = tiny_model_path("qwen3moe")
    config = SessionConfig(model_path=path, context=GIVEN, stream=stream_config(tmp_path / "p.json", "fast"))
    long_text, then = text_of(15), text_of(3, seed=2)
    with Session.open(config) as s:
        control = s.streaming
        assert control is not None and s.ctx.params.n_ubatch == N_CTX
        s.generate(GenerateRequest(long_text, n_predict=1))  # a prompt of ~1,700 tokens, no decode step
        before = resident_kib()
        given = control.give_back_compute()
        after = resident_kib()
        assert given >= 0.9 * s.ctx.compute_buffer_bytes
        # the prompt's attention scores alone took ~1,700 x 1,700 floats a head
        assert before - after >= 16 * 1024, (before, after)
        got = outcome(s, then)
    # resident at the same batch, the same two requests: the second after the pages went back
    whole = attrs.evolve(GIVEN, n_batch=N_CTX, n_ubatch=N_CTX)
    with Session.open(SessionConfig(model_path=path, context=whole)) as r:
        r.generate(GenerateRequest(long_text, n_predict=1))
        assert got.same(outcome(r, then))


class CountingProbe:
    """A memory probe that says memory is short, and counts its readings."""

    def __init__(self) -> None:
        self.readings = 0

    def read(self) -> MemoryReading:
        self.readings += 1
        return MemoryReading(room_bytes=10 * MIB, usable_bytes=1 << 30, pressure_pct=None)


def test_while_a_prompt_holds_the_room_the_governor_waits_and_a_budget_set_is_returned_to(
    tiny_model_path: TinyModelPath, tmp_path: Path
) -> None:
    path = tiny_model_path("qwen3moe")
    config = SessionConfig(model_path=path, context=GIVEN, stream=stream_config(tmp_path / "p.json", "fast"))
    with Session.open(config) as s:
        control = s.streaming
        assert control is not None
        entry = control.info.entry_bytes
        control.set_budget(20 * entry)
        probe = CountingProbe()
        floor = control.info.token_cycle_bytes
        governor = CacheGovernor(control, GovernorConfig(floor_bytes=floor, ceil_bytes=20 * entry), probe)
        s.generate(GenerateRequest(text_of(12), n_predict=1))  # a prompt, no decode step after it
        assert control.prompt_holds_room
        # the prompt's memory was planned: nothing decided (the reading only keeps the group's
        # limit-hit count current: a prompt's hits are not the decode's)
        assert governor.step() is None and probe.readings == 1
        control.set_budget(10 * entry)  # the user's budget while the prompt holds the room
        assert control.target_budget() == 10 * entry
        s.generate(GenerateRequest(text_of(1, seed=3), n_predict=4))
        assert not control.prompt_holds_room
        assert control.counters().budget_bytes == 10 * entry  # the budget it returned to
        governor.step()
        assert probe.readings == 2  # reading again: memory short, the cache shrinks
        assert control.target_budget() < 10 * entry
