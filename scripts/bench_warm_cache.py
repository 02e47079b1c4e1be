"""Benchmark (not a test): a cache that holds every expert against resident, in one process.

    python scripts/bench_warm_cache.py MODEL [--tokens N] [--cache-mb N] [--threads N]

Opens two bmoe sessions on MODEL in this process, one resident and one streaming with a
cache of ``--cache-mb`` (default: enough for every expert), prefills the bench's fixed text's
first 464 tokens in each (the streamed prefill reads the experts in), then feeds the next
``--tokens`` tokens one ``llama_decode`` at a time, alternating which session steps first
(A B, B A, ...), and times every step. Prints each session's median step, the median of the
per-token ratios (resident / streamed: above 1 means the streamed step was the faster),
and the streamed session's hits and misses over the decode. One process for both, step by
step: the machine's drift between processes (30% on this VM) falls out of the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bmoe.bench.child import BmoeStepper
from bmoe.bench.text import TEXT

PROMPT_TOKENS = 464
WARMUP = 16  # steps left out of the medians


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--cache-mb", type=int, default=None, help="default: every expert of the model")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    spec = {"model": str(args.model), "io_threads": 4, "n_ctx": 1024, "threads": args.threads}
    resident = BmoeStepper({**spec, "kind": "resident"})
    tokens = resident.session.model.tokenize(TEXT)
    if len(tokens) < PROMPT_TOKENS + args.tokens:
        raise SystemExit(
            f"the bench text has {len(tokens)} tokens: at most {len(tokens) - PROMPT_TOKENS} to feed"
        )
    streamed = BmoeStepper({**spec, "kind": "stream", "cache_mib": args.cache_mb})
    assert streamed.session.streaming is not None
    info = streamed.session.streaming.info
    expert_mib = info.expert_bytes / 2**20
    if args.cache_mb is None:
        streamed.session.streaming.set_budget(info.expert_bytes + info.entry_bytes)
    prompt, feed = tokens[:PROMPT_TOKENS], tokens[PROMPT_TOKENS : PROMPT_TOKENS + args.tokens]
    for s in (resident, streamed):
        s.prefill(prompt)
    before = streamed.session.streaming.counters()
    times: dict[str, list[float]] = {"resident": [], "streamed": []}
    for i, token in enumerate(feed):
        order = [("resident", resident), ("streamed", streamed)]
        for name, s in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            s.step(token, PROMPT_TOKENS + i)
            times[name].append(time.perf_counter() - t0)
    c = streamed.session.streaming.counters() - before
    a, b = times["resident"][WARMUP:], times["streamed"][WARMUP:]
    ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
    step_a, step_b = 1e3 * statistics.median(a), 1e3 * statistics.median(b)
    print(
        f"{args.model.name}: experts {expert_mib:,.0f} MiB; resident median step {step_a:.3f} ms, "
        f"streamed {step_b:.3f} ms; per-token ratio resident/streamed, median {ratio:.3f} "
        f"({len(a)} tokens); the streamed decode hit {c.hits}, missed {c.misses}"
    )


if __name__ == "__main__":
    main()
