"""Benchmark (not a test): a four-step agent trace of decisions, by prefix-cache mode.

    python scripts/bench_decide.py [--model PATH | --fixture qwen35moe] [--moe-stream --cache-mb N]
                                   [--rounds N] [--modes auto,on,off]

Prints one Markdown table per prefix-cache mode and round (modes interleaved: auto, on, off,
auto, ...; each in a fresh session): reused/prefilled tokens, prefill, restore and store
seconds, the kept state's size, what ``auto``'s piece policy chose and, when streaming, the
MiB each decision read and the seconds its prefill waited for reads; then the four
decisions' total (prefill + restore + store). Times are wall-clock seconds of this machine
at the moment of the run; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

from bmoe.adapters.llama import ContextParams
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


def run(path: Path, mode: str, stream: StreamConfig, threads: int) -> list[str]:
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
    total = 0.0
    with Session.open(cfg) as session:
        for name, request in TRACE:
            before = session.streaming.counters() if session.streaming is not None else None
            r = session.decide(request)
            read = waited = ""
            if before is not None and session.streaming is not None:
                spent = session.streaming.counters() - before
                read, waited = f"{spent.read_mib:.0f}", f"{spent.stall_s:.3f}"
            total += r.prefill_s + r.restore_s + r.store_s
            rows.append(
                f"| {name} | {r.best} | {r.n_reused} / {r.n_prefilled} | {r.prefill_s:.3f} | "
                f"{r.restore_s:.4f} | {r.store_s:.4f} | {r.prefix_state_mib:.2f} | {read} | {waited} "
                f"| {r.prefix_plan} |"
            )
    rows.append(f"\nseconds, all four decisions (prefill + restore + store): {total:.2f}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="GGUF model (default: the qwen35moe fixture)")
    p.add_argument("--fixture", default="qwen35moe", help="a bmoe.testing fixture name when no --model")
    p.add_argument("--moe-stream", action="store_true")
    p.add_argument("--cache-mb", type=int, default=None)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the modes")
    p.add_argument("--modes", default="auto,off", help="prefix-cache modes to compare (default: auto,off)")
    args = p.parse_args()
    path = args.model or fixture_path(args.fixture)
    stream = StreamConfig(enabled=args.moe_stream, cache_mb=args.cache_mb)
    print(
        f"model: {path} ({path.stat().st_size / 2**20:.0f} MiB), streaming: {args.moe_stream}, "
        f"cache_mb: {args.cache_mb}, threads: {args.threads}, {os.cpu_count()} CPUs, {platform.machine()}"
    )
    for round_ in range(1, args.rounds + 1):
        for mode in args.modes.split(","):
            print(f"\nprefix cache {mode}, round {round_}:\n")
            print("\n".join(run(path, mode, stream, args.threads)))


if __name__ == "__main__":
    main()
