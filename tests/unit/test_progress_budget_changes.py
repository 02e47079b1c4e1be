"""The governor's budget changes reach a protocol client: each ``BMOE_PROGRESS`` line carries
the changes made since the line before it (all of them before the first), with the budget in
force and what the cache holds; a client that does not know the keys reads the line as
before."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from bmoe.adapters.protocol import (
    NOT_MEASURED,
    Progress,
    ProgressBudgetChange,
    ResponseReader,
    encode_response,
)
from bmoe.cli.session_loop import SessionLoop, progress_response
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.domain.generation import Progress as TokenProgress
from bmoe.domain.streaming import MIB, StreamCounters
from bmoe.domain.streaming.governor import BudgetChange
from bmoe.domain.weight_layout import WeightLayout

SHRINK = BudgetChange(400 * MIB, 277 * MIB, "shrink: 197 MiB free, 13% of 1,536 MiB")
GROW = BudgetChange(277 * MIB, 341 * MIB, "grow: 1,336 MiB free (87%) for 2 readings")


def token(step: int, budget: int = 400 * MIB, resident: int = 390 * MIB) -> TokenProgress:
    stream = StreamCounters(hits=3, misses=1, budget_bytes=budget, resident_bytes=resident)
    return TokenProgress(step=step, steps=4, wall_ms=5.0, delta_text="x", delta_reasoning="", stream=stream)


def test_a_progress_line_writes_the_changes_after_the_protocols_first_keys_and_reads_back() -> None:
    line = encode_response(progress_response(token(2, budget=277 * MIB, resident=270 * MIB), [SHRINK]))
    assert line.endswith(
        b'"delta_text":"x","delta_reasoning":"","cache_resident_mib":270.0,"cache_budget_mib":277.0,'
        b'"budget_changes":[{"from_mib":400.0,"to_mib":277.0,'
        b'"why":"shrink: 197 MiB free, 13% of 1,536 MiB"}]}\n'
    )
    [back] = ResponseReader().feed(line)
    assert isinstance(back, Progress)
    assert back.budget_changes == (ProgressBudgetChange(from_mib=400, to_mib=277, why=SHRINK.why),)
    assert (back.cache_budget_mib, back.cache_resident_mib) == (277.0, 270.0)


def test_without_changes_the_list_is_empty_and_without_a_cache_the_sizes_are_not_measured() -> None:
    assert progress_response(token(1)).budget_changes == ()
    resident = TokenProgress(step=1, steps=4, wall_ms=5.0, delta_text="", delta_reasoning="")
    p = progress_response(resident)
    assert (p.cache_budget_mib, p.cache_resident_mib, p.budget_changes) == (NOT_MEASURED, NOT_MEASURED, ())


def test_a_line_of_an_engine_without_the_keys_still_reads() -> None:
    [old] = ResponseReader().feed(b'BMOE_PROGRESS {"step":1,"steps":4,"wall_ms":5.0}\n')
    assert isinstance(old, Progress) and old.budget_changes == () and old.cache_budget_mib == -1


# -- the session loop: changes as they come, each on one line ---------------------------------


@attrs.define
class FakeGovernor:
    changes: list[BudgetChange] = attrs.field(factory=list)


class FakeSession:
    """What ``SessionLoop`` uses of a session; ``generate`` decodes 3 tokens and runs
    ``between(step)`` before each (the governor acting meanwhile)."""

    load_s, arch, n_ctx, n_expert_used, think_ctl, placement_line = 0.5, "qwen3moe", 256, 2, False, ""
    weight_layout = WeightLayout(asked=False)

    def __init__(self, governor: FakeGovernor | None, between: Callable[[int], None]) -> None:
        self.governor = governor
        self.between = between

    def cancel(self) -> None:
        pass

    def generate(
        self,
        request: GenerateRequest,
        on_progress: Callable[[TokenProgress], None],
        on_begin: Callable[[], None],
    ) -> RunResult:
        on_begin()
        for step in (1, 2, 3):
            self.between(step)
            on_progress(token(step))
        return RunResult("xxx", "", (1, 2, 3), n_prompt=3, n_past=6, prefill_s=0.1, decode_s=0.2)


def serve(session: Any, requests: bytes, progress: bool = True) -> list[Any]:
    """Run the loop over ``requests`` (a pipe for stdin, as a real one), the lines it wrote."""
    read_fd, write_fd = os.pipe()
    out_r, out_w = os.pipe()
    with open(read_fd, "rb", buffering=0) as stdin, open(out_w, "wb") as stdout:
        os.write(write_fd, requests)
        os.close(write_fd)
        loop = SessionLoop(session, stdin, stdout, progress=progress)
        done = threading.Event()
        threading.Thread(target=lambda: (loop.run(), done.set()), daemon=True).start()
        assert done.wait(10)
    with open(out_r, "rb") as f:
        return ResponseReader().feed(f.read())


GENERATE = b'{"cmd":"generate","id":1,"prompt":"hi","n_predict":3}\n'


def test_each_change_is_on_the_first_progress_line_after_it_and_on_no_other() -> None:
    governor = FakeGovernor([SHRINK])  # made before the request: on its first line

    def between(step: int) -> None:
        if step == 3 and GROW not in governor.changes:  # during the first request's third token
            governor.changes.append(GROW)

    lines = serve(FakeSession(governor, between), GENERATE + GENERATE)
    progress = [line for line in lines if isinstance(line, Progress)]
    assert [len(p.budget_changes) for p in progress] == [1, 0, 1, 0, 0, 0]
    assert progress[0].budget_changes[0].why == SHRINK.why
    assert (progress[2].budget_changes[0].from_mib, progress[2].budget_changes[0].to_mib) == (277.0, 341.0)


@pytest.mark.parametrize("governor", [None, FakeGovernor()])
def test_no_governor_or_no_change_writes_an_empty_list(governor: FakeGovernor | None) -> None:
    lines = serve(FakeSession(governor, lambda step: None), GENERATE)
    assert [p.budget_changes for p in lines if isinstance(p, Progress)] == [(), (), ()]
