"""The governor under real memory pressure: a streamed session and a second process that
allocates memory in steps, then frees it, both in one memory cgroup. The session's governor
(reading its own cgroup through ``MemoryProbe``) shrinks the cache before the limit is hit,
nobody is OOM-killed, the text equals an unpressured run's, and the budget grows back once the
other process has freed its memory. Bounded: the allocator stops by itself after a few
seconds, the session after the allocator is done or 90 s. Skipped where no memory cgroup can
be made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bmoe.bench.cgroup import CgroupError, MemoryGroup, machine_sites
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

MIB = 1024 * 1024
LIMIT_MIB = 1536
CACHE_MIB = 400
OVER_MIB = 200  # the other process takes what is free and this much more, in steps of
STEP_MIB = 64

SESSION = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from bmoe.adapters.llama import ContextParams
    from bmoe.bench.text import TEXT
    from bmoe.domain.generation import GenerateRequest
    from bmoe.domain.sampling import SamplingParams
    from bmoe.domain.streaming import MIB, StreamConfig
    from bmoe.domain.streaming.governor import GovernorConfig
    from bmoe.runtime import Session, SessionConfig
    from bmoe.runtime.governor import CacheGovernor

    model, signals = Path(sys.argv[1]), Path(sys.argv[2])
    governed, turns = sys.argv[3] == "1", int(sys.argv[4])
    sys.stdin.readline()  # in the group first
    config = SessionConfig(
        model_path=model,
        context=ContextParams(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=2),
        stream=StreamConfig(enabled=True, cache_mb=CACHE_MIB, governor="off"),
    )
    with Session.open(config) as s:
        gov = None
        if governed:
            info = s.streaming.streaming.info
            gov = CacheGovernor(
                s.streaming,
                GovernorConfig(
                    floor_bytes=info.token_cycle_bytes, ceil_bytes=info.budget.bytes,
                    shrink_below_bytes=200 * MIB, comfort_bytes=320 * MIB, grow_above_bytes=450 * MIB,
                    step_bytes=64 * MIB, grow_after=2, cooldown=2,
                ),
                interval_s=0.1,
            )
            gov.start()
        t0 = time.monotonic()
        for i in range(turns or 1000):
            if not turns and ((signals / "done").exists() or time.monotonic() - t0 > 120):
                break
            prompt = TEXT[(37 * i) % 2000 :][:120]  # a new stretch of text each turn: wide routing
            r = s.generate(GenerateRequest(prompt, n_predict=4, sampling=SamplingParams(temp=0.0)))
            c = s.streaming.counters()
            if c.resident_bytes >= 0.85 * CACHE_MIB * MIB:
                (signals / "filled").touch()
            print(json.dumps({"i": i, "tokens": r.tokens, "budget": c.budget_bytes,
                              "resident": c.resident_bytes}), flush=True)
        if gov is not None:
            gov.close()
            print(json.dumps({"changes": [[c.before, c.after, c.why] for c in gov.changes]}), flush=True)
    """
).replace("CACHE_MIB", str(CACHE_MIB))

HOG = (
    textwrap.dedent(
        """
    import sys, time
    from pathlib import Path
    from bmoe.adapters.memory_pressure import MemoryProbe
    signals = Path(sys.argv[1])
    sys.stdin.readline()
    t0 = time.monotonic()
    while not (signals / "filled").exists() and time.monotonic() - t0 < 90:
        time.sleep(0.1)
    room = MemoryProbe().read().room_bytes
    target = room + OVER_MIB * 1024 * 1024  # more than is free: fits only if the cache yields
    held, got = [], 0
    while got < target:
        block = bytearray(min(STEP_MIB * 1024 * 1024, target - got))
        for k in range(0, len(block), 4096):  # touch every page: charged to the group now
            block[k] = 1
        held.append(block)
        got += len(block)
        time.sleep(0.5)
    print(f"hog: {room >> 20} MiB free at start, held {got >> 20} MiB", file=sys.stderr)
    time.sleep(2.0)
    held.clear()
    time.sleep(4.0)
    (signals / "done").touch()
    """
    )
    .replace("OVER_MIB", str(OVER_MIB))
    .replace("STEP_MIB", str(STEP_MIB))
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 8 layers x 64 experts of 1024 x 512 in Q4_0: 432 MiB of experts, each 864 KiB
    shape = SyntheticShape(n_layer=8, n_embd=1024, n_ff_exp=512, n_expert=64, n_expert_used=4)
    return write_synthetic(tmp_path_factory.mktemp("pressure") / "model.gguf", shape, 0, progress=False)


def _run(
    model: Path, signals: Path, *, governed: bool, group: MemoryGroup | None, turns: int = 0
) -> tuple[list[dict], int]:
    signals.mkdir()
    session = subprocess.Popen(
        [sys.executable, "-c", SESSION, str(model), str(signals), "1" if governed else "0", str(turns)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    hog = None
    if group is not None:
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(signals)], stdin=subprocess.PIPE, text=True)
        group.add(session.pid)
        group.add(hog.pid)
        assert hog.stdin is not None
        hog.stdin.write("go\n")
        hog.stdin.close()
    out, err = session.communicate("go\n", timeout=300)
    hog_rc = hog.wait(timeout=120) if hog is not None else 0
    assert session.returncode == 0, f"session exit {session.returncode}: {err[-2000:]}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], hog_rc


def test_the_governor_yields_to_another_process_and_takes_the_memory_back(
    model: Path, tmp_path: Path
) -> None:
    try:
        group = MemoryGroup.create(machine_sites(), f"bmoe-pressure-{os.getpid()}", LIMIT_MIB * MIB)
    except CgroupError as exc:
        pytest.skip(f"no memory cgroup here: {exc}")
    try:
        lines, hog_rc = _run(model, tmp_path / "pressed", governed=True, group=group)
        oom_kills = group.oom_kills()
    finally:
        group.close()
    assert oom_kills == 0 and hog_rc == 0
    turns = [line for line in lines if "tokens" in line]
    [changes] = [line["changes"] for line in lines if "changes" in line]
    baseline, _ = _run(model, tmp_path / "calm", governed=False, group=None, turns=len(turns))
    assert [t["tokens"] for t in turns] == [b["tokens"] for b in baseline]  # exact under pressure
    shrinks = [c for c in changes if c[1] < c[0]]
    grows = [c for c in changes if c[1] > c[0]]
    print("governor changes:", *changes, sep="\n  ")
    assert shrinks, changes  # it yielded while the other process held memory
    assert grows and changes.index(grows[-1]) > changes.index(shrinks[-1]), changes  # and took it back
    assert min(t["budget"] for t in turns) < CACHE_MIB * MIB
