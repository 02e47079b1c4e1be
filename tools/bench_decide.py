"""Benchmark (not a test): a four-step agent trace of decisions, by prefix-cache mode.

    python tools/bench_decide.py [--model PATH | --fixture qwen35moe] [--moe-stream --cache-mb N]
                                 [--rounds N] [--modes auto,on,off] [--resident-too]
                                 [--disk-mib-s N]

Prints one Markdown table per prefix-cache mode and round (modes interleaved: auto, on, off,
auto, ...; each in a fresh session): reused/prefilled tokens, prefill, restore and store
seconds, the kept state's size, what ``auto``'s piece policy chose and, when streaming, the
MiB each decision read and the seconds its prefill waited for reads; then the four
decisions' total (prefill + restore + store). ``--resident-too`` also runs each mode resident
(every weight in RAM) in the same rounds, and ``--disk-mib-s N`` holds the script's reads of
the model's disk to N MiB/s (an I/O cgroup, as ``python -m bmoe.bench --disk-mib-s``); with
both, the end says, per streamed mode, how the trace's time stands against its floors:

- compute floor: the same mode's resident trace in the same round (the compute of the pieces
  it prefilled, with nothing to read);
- read floor: the MiB the streamed trace read from the disk / N (the I/O group's count, what
  the throttle held: its reads at the throttle, with nothing to compute);

and the ratio of each mode's total to the first mode's, per round (interleaved pairs), median.
Times are wall-clock seconds of this machine at the moment of the run; run it on a quiet
machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from pathlib import Path

import attrs

from bmoe.adapters.llama import ContextParams
from bmoe.bench.io_group import IoGroup
from bmoe.domain.decide import DecideConfig, DecideRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures import fixture_path

TASK = "You control an Android phone. Task: turn on Wi-Fi. History: none. "
TRACE = [
    (
        "home screen",
        DecideRequest(
            prefix=TASK,
            suffix="Screen: Home. Options: A) Settings B) Camera C) Clock. Answer with the letter.",
            choices=("A", "B", "C"),
        ),
    ),
    (
        "settings, same prefix",
        DecideRequest(
            prefix=TASK,
            suffix="Screen: Settings. Options: A) Network B) Display C) Battery. Answer with the letter.",
            choices=("A", "B", "C"),
        ),
    ),
    (
        "network, grown prefix",
        DecideRequest(
            prefix=TASK + "Opened Settings, then Network. ",
            suffix="Screen: Network. Options: A) Mobile B) Internet C) SIMs. Answer with the letter.",
            choices=("A", "B", "C"),
        ),
    ),
    (
        "same, reuse_prefix false",
        DecideRequest(
            prefix=TASK + "Opened Settings, then Network. ",
            suffix="Screen: Network. Options: A) Mobile B) Internet C) SIMs. Answer with the letter.",
            choices=("A", "B", "C"),
            reuse_prefix=False,
        ),
    ),
]


@attrs.frozen
class Trace:
    """One run of the trace: its table, the four decisions' seconds and what they read."""

    rows: list[str]
    total_s: float
    read_mib: float
    disk_mib: float = 0.0  # what the I/O group read from the disk during the decisions


THROTTLE: list[IoGroup] = []  # the I/O group this process sits in, with --disk-mib-s


def run(path: Path, mode: str, stream: StreamConfig, threads: int) -> Trace:
    cfg = SessionConfig(
        model_path=path,
        context=ContextParams(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=threads),
        chat=True,
        decide=DecideConfig(enabled=True, prefix_cache=mode),  # type: ignore[arg-type]
        stream=stream,
    )
    rows = [
        "| decision | best | reused / prefilled | prefill s | restore s | store s | kept state MiB "
        "| read MiB | waited for reads s | auto's plan |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    total = read_mib = 0.0
    with Session.open(cfg) as session:
        disk_before = THROTTLE[0].read_bytes() if THROTTLE else 0
        for name, request in TRACE:
            before = session.streaming.counters() if session.streaming is not None else None
            r = session.decide(request)
            read = waited = ""
            if before is not None and session.streaming is not None:
                spent = session.streaming.counters() - before
                read, waited = f"{spent.read_mib:.0f}", f"{spent.stall_s:.3f}"
                read_mib += spent.read_mib
            total += r.prefill_s + r.restore_s + r.store_s
            rows.append(
                f"| {name} | {r.best} | {r.n_reused} / {r.n_prefilled} | {r.prefill_s:.3f} | "
                f"{r.restore_s:.4f} | {r.store_s:.4f} | {r.prefix_state_mib:.2f} | {read} | {waited} "
                f"| {r.prefix_plan} |"
            )
        disk_mib = (THROTTLE[0].read_bytes() - disk_before) / 2**20 if THROTTLE else 0.0
    rows.append(f"\nseconds, all four decisions (prefill + restore + store): {total:.2f}")
    if THROTTLE:
        rows.append(f"read from the disk meanwhile (the I/O group's count): {disk_mib:,.0f} MiB")
    return Trace(rows, total, read_mib, disk_mib)


def enter_disk_throttle(path: Path, mib_s: int) -> None:
    """Put this process in an I/O cgroup holding reads of ``path``'s disk to ``mib_s`` MiB/s
    (the bench's group; removed when the process has left it at exit)."""
    import atexit

    from bmoe.bench.cgroup import machine_sites
    from bmoe.bench.io_group import DiskThrottle, IoGroup, block_device_of

    device = block_device_of(path)
    group = IoGroup.create(machine_sites("blkio"), f"bmoe-decide-{os.getpid()}", device, DiskThrottle(mib_s))
    origin = _own_group_procs(group.version)
    group.add(os.getpid())
    THROTTLE.append(group)

    def leave() -> None:
        if origin is not None:
            origin.write_text(str(os.getpid()))
            group.close(attempts=10)

    atexit.register(leave)
    print(f"reads of {device.name} ({device.dev}) held to {mib_s} MiB/s ({group.path})")


def _own_group_procs(version: int) -> Path | None:
    """The ``cgroup.procs`` of the group this process sits in now (to go back at exit)."""
    from bmoe.bench.cgroup import machine_sites

    sites = [s for s in machine_sites("blkio") if s.version == version]
    return sites[0].parent / "cgroup.procs" if sites else None


def floors_table(stream: dict[str, list[Trace]], resident: dict[str, list[Trace]], mib_s: int) -> list[str]:
    """Per streamed mode, medians over rounds: its total, its floors, and its time over the
    larger floor (per round, then the median). The read floor counts what the I/O group read
    from the disk (the kernel's count, what the throttle held); the streamer's own count is
    shown beside it."""
    rows = [
        "| mode | streamed s | resident s (compute floor) | disk MiB (streamer's count) | read floor s "
        "| streamed / max(floors) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, traces in stream.items():
        pairs = list(zip(traces, resident.get(mode, []), strict=False))
        over = [t.total_s / max(r.total_s, t.disk_mib / mib_s) for t, r in pairs]
        rows.append(
            f"| {mode} | {statistics.median(t.total_s for t in traces):.2f} | "
            f"{statistics.median(r.total_s for _, r in pairs):.2f} | "
            f"{statistics.median(t.disk_mib for t in traces):,.0f} "
            f"({statistics.median(t.read_mib for t in traces):,.0f}) | "
            f"{statistics.median(t.disk_mib / mib_s for t in traces):.2f} | {statistics.median(over):.2f} |"
        )
    return rows


def ratios_text(label: str, traces: dict[str, list[Trace]]) -> str:
    """Each mode's total over the first mode's, per round, and the median of those pairs."""
    modes = list(traces)
    parts = []
    for mode in modes[1:]:
        per_round = [a.total_s / b.total_s for a, b in zip(traces[modes[0]], traces[mode], strict=False)]
        shown = ", ".join(f"{x:.2f}" for x in per_round)
        parts.append(f"{modes[0]} / {mode}: {statistics.median(per_round):.2f} (rounds: {shown})")
    return f"{label}: " + "; ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="GGUF model (default: the qwen35moe fixture)")
    p.add_argument("--fixture", default="qwen35moe", help="a bmoe.testing fixture name when no --model")
    p.add_argument("--moe-stream", action="store_true")
    p.add_argument("--cache-mb", type=int, default=None)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the modes")
    p.add_argument("--modes", default="auto,off", help="prefix-cache modes to compare (default: auto,off)")
    p.add_argument("--resident-too", action="store_true", help="also run each mode resident, interleaved")
    p.add_argument("--disk-mib-s", type=int, default=0, help="hold reads of the model's disk to N MiB/s")
    args = p.parse_args()
    path = args.model or fixture_path(args.fixture)
    if args.disk_mib_s:
        enter_disk_throttle(path, args.disk_mib_s)
    stream = StreamConfig(enabled=args.moe_stream, cache_mb=args.cache_mb)
    print(
        f"model: {path} ({path.stat().st_size / 2**20:.0f} MiB), streaming: {args.moe_stream}, "
        f"cache_mb: {args.cache_mb}, threads: {args.threads}, {os.cpu_count()} CPUs, {platform.machine()}"
    )
    kinds = [("streamed" if args.moe_stream else "resident", stream)]
    if args.resident_too and args.moe_stream:
        kinds.append(("resident", StreamConfig()))
    modes = args.modes.split(",")
    traces: dict[str, dict[str, list[Trace]]] = {kind: {m: [] for m in modes} for kind, _ in kinds}
    for round_ in range(1, args.rounds + 1):
        for kind, config in kinds:
            for mode in modes:
                print(f"\n{kind}, prefix cache {mode}, round {round_}:\n")
                trace = run(path, mode, config, args.threads)
                traces[kind][mode].append(trace)
                print("\n".join(trace.rows))
    print()
    for kind, by_mode in traces.items():
        if len(modes) > 1:
            print(ratios_text(kind, by_mode))
    if args.moe_stream and args.resident_too and args.disk_mib_s:
        print()
        print("\n".join(floors_table(traces["streamed"], traces["resident"], args.disk_mib_s)))


if __name__ == "__main__":
    main()
