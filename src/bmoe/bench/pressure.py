"""Memory pressure on a streamed session: the two processes the governor's pressure gate
(tests/gates/test_governor_pressure.py) and ``tools/governor_cycles.py`` run in one memory
cgroup, each a ``python -m bmoe.bench.pressure`` subcommand.

- ``session MODEL SIGNALS``: a streamed session that generates turn after turn (4 greedy
  tokens of a new stretch of text each, so routing stays wide) until ``SIGNALS/done``
  appears, ``--turns`` are done, or ``--max-s`` has passed. With ``--governed``, a
  :class:`~bmoe.runtime.governor.CacheGovernor` reading its own cgroup moves the budget
  (the thresholds of :func:`pressure_governor_config`, scaled to a 1.5 GiB group). It prints
  one JSON line per turn (``i``, ``tokens``, ``budget``, ``resident``, ``t``), touches
  ``SIGNALS/filled`` each time the budget is back at ``--cache-mib`` and the cache holds 85%
  of it, and at the end one line
  with the governor's ``changes`` (``[t, from, to, why]``) and ``samples`` (per reading:
  ``[t, room, usable, pressure_pct, budget, resident]``, bytes; ``t`` is
  ``time.monotonic()``, one clock for every process of the machine).
- ``hog SIGNALS``: the other process. ``--cycles`` times: it waits for ``SIGNALS/filled``
  (at most ``--wait-s``), reads the memory free to it (``MemoryProbe``: its cgroup's room)
  and takes that much plus ``--over-mib`` in blocks of ``--step-mib`` (each page touched, so
  charged to the group at once) every 0.5 s: more than is free, so it fits only if the cache
  yields. It holds them ``--hold-s``, frees them, removes ``SIGNALS/filled`` and rests
  ``--rest-s``. Then it touches ``SIGNALS/done``. With ``--log FILE`` it writes a JSON line
  per change of what it holds (``t``, ``cycle``, ``held_mib``, ``event``). Bounded in size
  (free memory + ``--over-mib``) and in time (``--cycles`` x (``--wait-s`` + allocation +
  hold + rest)).

Both read one line on stdin before they start, so the caller can put them in the group first.
The hog imports neither llama.cpp nor numpy (the session's modules are imported in
``run_session``): what it holds is its blocks and a bare interpreter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from bmoe.adapters.memory_pressure import MemoryProbe
from bmoe.domain.streaming.config import MIB
from bmoe.domain.streaming.governor import BudgetChange, GovernorConfig, MemoryReading

if TYPE_CHECKING:
    from bmoe.runtime.streaming import StreamingControl
    from bmoe.tinymodel.synthetic import SyntheticShape


def pressure_shape() -> SyntheticShape:
    """The model: 8 layers x 64 experts of 1024 x 512 in Q4_0, 432 MiB of experts, each
    864 KiB (``write_synthetic(path, pressure_shape(), 0)``)."""
    from bmoe.tinymodel.synthetic import SyntheticShape

    return SyntheticShape(n_layer=8, n_embd=1024, n_ff_exp=512, n_expert=64, n_expert_used=4)


FILLED = 0.85  # the cache holds this share of its budget: "filled"


def pressure_governor_config(floor_bytes: int, ceil_bytes: int) -> GovernorConfig:
    """The governor's thresholds for a 1.5 GiB group (the defaults are for a machine: they
    leave 1 GiB to everything else)."""
    return GovernorConfig(
        floor_bytes=floor_bytes,
        ceil_bytes=ceil_bytes,
        shrink_below_bytes=200 * MIB,
        comfort_bytes=320 * MIB,
        grow_above_bytes=450 * MIB,
        step_bytes=64 * MIB,
        grow_after=2,
        cooldown=2,
    )


class RecordingProbe(MemoryProbe):
    """``MemoryProbe`` that keeps each reading with the budget and the cache's bytes then."""

    def __init__(self, control: StreamingControl) -> None:
        super().__init__()
        self.control = control
        self.samples: list[tuple[float, int, int, float | None, int, int]] = []

    def read(self) -> MemoryReading:
        r = super().read()
        c = self.control.counters()
        self.samples.append(
            (time.monotonic(), r.room_bytes, r.usable_bytes, r.pressure_pct, c.budget_bytes, c.resident_bytes)
        )
        return r


def _emit(out: TextIO, obj: object) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def run_session(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    from bmoe.adapters.llama import ContextParams
    from bmoe.bench.text import TEXT
    from bmoe.domain.generation import GenerateRequest
    from bmoe.domain.sampling import SamplingParams
    from bmoe.domain.streaming import StreamConfig
    from bmoe.runtime import Session, SessionConfig
    from bmoe.runtime.governor import CacheGovernor

    signals: Path = args.signals
    sys.stdin.readline()  # in the group first
    config = SessionConfig(
        model_path=args.model,
        context=ContextParams(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=2),
        stream=StreamConfig(enabled=True, cache_mb=args.cache_mib, governor="off"),
    )
    changes: list[tuple[float, BudgetChange]] = []
    with Session.open(config) as s:
        assert s.streaming is not None
        gov = probe = None
        if args.governed:
            info = s.streaming.streaming.info
            probe = RecordingProbe(s.streaming)
            gov = CacheGovernor(
                s.streaming,
                pressure_governor_config(info.token_cycle_bytes, info.budget.bytes),
                probe,
                interval_s=args.interval_s,
                on_change=lambda change: changes.append((time.monotonic(), change)),
            )
            gov.start()
        t0 = time.monotonic()
        for i in range(args.turns or 1 << 30):
            if not args.turns and ((signals / "done").exists() or time.monotonic() - t0 > args.max_s):
                break
            prompt = TEXT[(37 * i) % 2000 :][:120]  # a new stretch of text each turn: wide routing
            r = s.generate(GenerateRequest(prompt, n_predict=4, sampling=SamplingParams(temp=0.0)))
            c = s.streaming.counters()
            if c.resident_bytes >= FILLED * args.cache_mib * MIB and c.budget_bytes >= args.cache_mib * MIB:
                (signals / "filled").touch()
            _emit(
                out,
                {"i": i, "tokens": r.tokens, "budget": c.budget_bytes, "resident": c.resident_bytes,
                 "t": time.monotonic()},
            )  # fmt: skip
        if gov is not None and probe is not None:
            gov.close()
            _emit(
                out,
                {"changes": [[t, c.before, c.after, c.why] for t, c in changes], "samples": probe.samples},
            )
    return 0


def run_hog(args: argparse.Namespace) -> int:
    signals: Path = args.signals
    log = open(args.log, "a") if args.log else None  # noqa: SIM115  # closed below

    def note(cycle: int, held: int, event: str) -> None:
        if log is not None:
            _emit(log, {"t": time.monotonic(), "cycle": cycle, "held_mib": held / MIB, "event": event})

    sys.stdin.readline()
    try:
        for cycle in range(args.cycles):
            t0 = time.monotonic()
            while not (signals / "filled").exists() and time.monotonic() - t0 < args.wait_s:
                time.sleep(0.1)
            room = MemoryProbe().read().room_bytes
            target = room + args.over_mib * MIB  # more than is free: fits only if the cache yields
            held: list[bytearray] = []
            got = 0
            note(cycle, 0, "start")
            while got < target:
                block = bytearray(min(args.step_mib * MIB, target - got))
                for k in range(0, len(block), 4096):  # touch every page: charged to the group now
                    block[k] = 1
                held.append(block)
                got += len(block)
                note(cycle, got, "alloc")
                time.sleep(0.5)
            print(
                f"hog: cycle {cycle}: {room >> 20} MiB free at start, held {got >> 20} MiB", file=sys.stderr
            )
            time.sleep(args.hold_s)
            held.clear()
            (signals / "filled").unlink(missing_ok=True)
            note(cycle, 0, "free")
            time.sleep(args.rest_s)
        (signals / "done").touch()
    finally:
        if log is not None:
            log.close()
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bmoe.bench.pressure", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("session", help="a streamed session generating turn after turn")
    s.add_argument("model", type=Path)
    s.add_argument("signals", type=Path)
    s.add_argument("--governed", action="store_true", help="run the governor on its own cgroup's readings")
    s.add_argument("--turns", type=int, default=0, help="this many turns (0: until SIGNALS/done)")
    s.add_argument("--max-s", type=float, default=120.0, help="stop after this long without --turns")
    s.add_argument("--cache-mib", type=int, default=400)
    s.add_argument("--interval-s", type=float, default=0.1, help="the governor's reading interval")
    h = sub.add_parser("hog", help="the process that takes the free memory and more, and frees it")
    h.add_argument("signals", type=Path)
    h.add_argument("--cycles", type=int, default=1)
    h.add_argument("--over-mib", type=int, default=200)
    h.add_argument("--step-mib", type=int, default=64)
    h.add_argument("--hold-s", type=float, default=2.0)
    h.add_argument("--rest-s", type=float, default=4.0)
    h.add_argument("--wait-s", type=float, default=90.0, help="the longest wait for the cache to fill")
    h.add_argument("--log", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_session(args) if args.what == "session" else run_hog(args)


if __name__ == "__main__":
    sys.exit(main())
