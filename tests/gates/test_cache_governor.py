"""The memory-pressure governor on a real streamed session: readings that say memory is
short shrink the budget (evicting, pages given back) and calm ones grow it back, between
decodes, and the text is bit for bit what an ungoverned session writes; the session starts
the governor only where asked (``auto``: under ``--cache-mb auto``) and stops it on close."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import MIB, StreamConfig
from bmoe.domain.streaming.governor import GovernorConfig, MemoryReading
from bmoe.errors import ConfigError
from bmoe.runtime import Session, SessionConfig
from bmoe.runtime.governor import CacheGovernor

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
PROMPTS = ["The quick brown fox jumps over the lazy dog", "And then the dog", "A third turn"]
USABLE = 1 << 30


class ScriptedProbe:
    """Readings from a script: the MiB of memory free at each reading."""

    def __init__(self, free_mib: list[int]) -> None:
        self.free = list(free_mib)

    def read(self) -> MemoryReading:
        mib = self.free.pop(0) if len(self.free) > 1 else self.free[0]
        return MemoryReading(room_bytes=mib * MIB, usable_bytes=USABLE, pressure_pct=None)


def config(path: Path, governor: str = "off", cache_mb: int | None = 2) -> SessionConfig:
    return SessionConfig(
        model_path=path,
        context=PARAMS,
        stream=StreamConfig(enabled=True, cache_mb=cache_mb, governor=governor),
    )


def texts(session: Session, between: Callable[[], None] = lambda: None) -> list[tuple[int, ...]]:
    out = []
    for i, prompt in enumerate(PROMPTS):
        request = GenerateRequest(
            prompt, n_predict=24, clear_kv=i == 0, sampling=SamplingParams(temp=0.8, seed=5)
        )
        out.append(tuple(session.generate(request).tokens))
        between()
    return out


def test_a_governed_budget_moves_between_decodes_and_the_text_does_not(tiny_model_path: TinyModel) -> None:
    path = tiny_model_path("qwen3moe")
    with Session.open(config(path)) as plain:
        expected = texts(plain)
    with Session.open(config(path)) as s:
        assert s.streaming is not None and s.governor is None  # a budget in MiB, governor off
        start = s.streaming.counters().budget_bytes
        floor = s.streaming.streaming.info.token_cycle_bytes
        governor = CacheGovernor(
            s.streaming,
            GovernorConfig(
                floor_bytes=floor,
                ceil_bytes=start,
                shrink_below_bytes=100 * MIB,
                comfort_bytes=200 * MIB,
                grow_above_bytes=400 * MIB,
                step_bytes=MIB // 4,
                grow_after=1,
                cooldown=0,
            ),
            ScriptedProbe([50, 900, 900]),
        )
        budgets: list[int] = []

        def step() -> None:
            governor.step()
            budgets.append(s.streaming.counters().budget_bytes if s.streaming else 0)

        assert texts(s, step) == expected
        resident = s.streaming.counters().resident_bytes
    assert budgets[0] == floor < start  # memory short: down to the token cycle at once
    assert budgets[0] < budgets[1] <= budgets[2] <= start  # then free: it grows back by steps
    assert [c.shrinks for c in governor.changes][:2] == [True, False]
    assert all("MiB" in c.text() for c in governor.changes)
    assert resident <= budgets[-1]


def test_the_session_runs_the_governor_only_where_asked(tiny_model_path: TinyModel) -> None:
    path = tiny_model_path("qwen3moe")
    with Session.open(config(path, governor="auto", cache_mb=None)) as auto:
        assert auto.governor is not None  # --cache-mb auto: on by default
        thread = auto.governor._thread
        assert thread is not None and thread.is_alive()
        auto.generate(GenerateRequest(PROMPTS[0], n_predict=4))
        auto.set_cache_budget(1)  # the user's budget is the ceiling from then on
        assert auto.governor.policy.config.ceil_bytes == MIB
        assert auto.governor.policy.config.floor_bytes <= MIB
        assert auto.streaming is not None
        auto.streaming.set_budget(3 * MIB // 4)  # so is one set past the session
        auto.governor.step()
        assert auto.governor.policy.config.ceil_bytes == 3 * MIB // 4
        assert auto.streaming.counters().budget_bytes <= 3 * MIB // 4
    assert not thread.is_alive()  # stopped with the session
    with Session.open(config(path, governor="auto", cache_mb=2)) as fixed:
        assert fixed.governor is None
    with Session.open(config(path, governor="on", cache_mb=2)) as on:
        assert on.governor is not None and on.governor.policy.config.ceil_bytes == 2 * MIB
    with pytest.raises(ConfigError, match="needs the cache"):
        StreamConfig(enabled=True, cache_mb=0, governor="on")
    with pytest.raises(ConfigError, match="governor must be one of"):
        StreamConfig(enabled=True, governor="sometimes")


def test_a_budget_set_while_a_decode_runs_is_applied_by_the_next_decode(tiny_model_path: TinyModel) -> None:
    """The decoding thread takes its lock back within microseconds (``threading.Lock`` is
    not fair): a budget set meanwhile is left pending and the next decode applies it
    before it runs, whoever wins the lock."""
    import threading
    import time

    path = tiny_model_path("qwen3moe")
    with Session.open(config(path)) as s:
        control = s.streaming
        assert control is not None
        start = control.counters().budget_bytes
        with control:  # a decode in flight
            setter = threading.Thread(target=control.set_budget, args=(start // 2,))
            setter.start()
            deadline = time.monotonic() + 10
            while control._pending_budget is None and time.monotonic() < deadline:
                time.sleep(0.001)
            assert control.counters().budget_bytes == start  # not while the decode runs
        with control:  # the next decode, even if it takes the lock before the setter
            assert control.counters().budget_bytes == start // 2
        setter.join()
        assert control.counters().budget_bytes == start // 2


def test_the_governor_never_waits_for_a_decode_in_flight(tiny_model_path: TinyModel) -> None:
    """Under pressure decodes slow down: a governor that waited for the decode lock missed
    readings for seconds. Its change is left pending: applied by the next decode, or by the
    governor's next reading when none runs."""
    path = tiny_model_path("qwen3moe")
    with Session.open(config(path)) as s:
        control = s.streaming
        assert control is not None
        start = control.counters().budget_bytes
        floor = control.streaming.info.token_cycle_bytes
        governor = CacheGovernor(
            control,
            GovernorConfig(floor_bytes=floor, ceil_bytes=start, shrink_below_bytes=100 * MIB),
            ScriptedProbe([50, 50]),
        )
        with control:  # a decode in flight: the step returns at once
            change = governor.step()
            assert change is not None and change.after == floor
            assert control.counters().budget_bytes == start and control.target_budget() == floor
            assert governor.step() is None  # its next reading sees its own target, not a stranger's
            assert governor.policy.config.ceil_bytes == start
        assert control.counters().budget_bytes == start  # no decode came, nothing applied yet
        control.settle()  # what the governor's next reading does first
        assert control.counters().budget_bytes == floor
