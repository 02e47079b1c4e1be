"""Benchmark (not a test): ``Session.generate_batch``'s aggregate tok/s at several sequences.

    python tools/bench_parallel.py MODEL [--parallel 1,2,4] [--cache-mb N] [--rounds N]
                                   [--tokens N]

Four requests (40-word pieces of README.md, sampled at temperature 1, one seed each) are
answered together at each ``--parallel`` count, resident and streamed (``--cache-mb``; 0
skips the streamed runs), every configuration in its own session, opened once; the rounds
interleave the configurations (resident 1, 2, 4, streamed 1, 2, 4, then again), each round
after one warm-up request. Prints per configuration the median aggregate tok/s (generated
tokens / wall time of the batch), the rounds, and for streamed runs the MiB read per
generated token.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--parallel", default="1,2,4")
    p.add_argument("--cache-mb", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    words = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8").split()
    requests = [
        GenerateRequest(
            " ".join(words[i * 40 : (i + 1) * 40]),
            n_predict=args.tokens,
            sampling=SamplingParams(temp=1.0, seed=i),
        )
        for i in range(4)
    ]
    counts = [int(n) for n in args.parallel.split(",")]
    modes = ["resident"] + (["stream"] if args.cache_mb else [])
    sessions = {}
    for mode in modes:
        for n in counts:
            stream = (
                StreamConfig(enabled=True, cache_mb=args.cache_mb) if mode == "stream" else StreamConfig()
            )
            context = ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, n_seq_max=n)
            sessions[(mode, n)] = Session.open(
                SessionConfig(model_path=args.model, context=context, stream=stream)
            )
    rates: dict[tuple[str, int], list[float]] = {k: [] for k in sessions}
    mib: dict[tuple[str, int], list[float]] = {k: [] for k in sessions}
    try:
        for _ in range(args.rounds):
            for key, session in sessions.items():
                session.generate_batch(requests[:1])
                before = session.streaming.counters() if session.streaming is not None else None
                t0 = time.perf_counter()
                results = session.generate_batch(requests)
                wall = time.perf_counter() - t0
                tokens = sum(len(r.tokens) for r in results)
                rates[key].append(tokens / wall)
                if before is not None and session.streaming is not None:
                    mib[key].append((session.streaming.counters() - before).bytes_read / 1048576 / tokens)
    finally:
        for session in sessions.values():
            session.close()
    print("| configuration | aggregate tok/s (median) | rounds | MiB read per token |")
    print("| --- | ---: | --- | ---: |")
    for (mode, n), values in rates.items():
        read = f"{statistics.median(mib[(mode, n)]):.2f}" if mib[(mode, n)] else ""
        rounds = ", ".join(f"{v:.1f}" for v in values)
        name = f"{mode}, {n} sequence{'s' if n > 1 else ''}"
        print(f"| {name} | {statistics.median(values):.1f} | {rounds} | {read} |")


if __name__ == "__main__":
    main()
