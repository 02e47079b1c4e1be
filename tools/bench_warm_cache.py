"""Benchmark (not a test): a cache that holds every expert against resident, in one process.

    python tools/bench_warm_cache.py MODEL [--tokens N] [--cache-mb N] [--threads N] [--pass-too]

Opens two bmoe sessions on MODEL in this process, one resident and one streaming with a
cache of ``--cache-mb`` (default: enough for every expert), prefills the bench's fixed text's
first 464 tokens in each (the streamed prefill reads the experts in), then feeds the next
``--tokens`` tokens one ``llama_decode`` at a time, alternating which session steps first
(A B, B A, ...), and times every step. Prints each session's median step, the median of the
per-token ratios (resident / streamed: above 1 means the streamed step was the faster),
and the streamed session's hits and misses over the decode. One process for both, step by
step: the machine's drift between processes (30% on this VM) falls out of the ratio.
``--pass-too`` adds a third session, streamed with ``StreamConfig.pass_layers`` on (a call
of a layer the cache holds whole is passed: no graph stop), in the same rotation.
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
    p.add_argument("--pass-too", action="store_true", help="also a streamed session with pass_layers on")
    args = p.parse_args()
    spec = {"model": str(args.model), "io_threads": 4, "n_ctx": 1024, "threads": args.threads}
    resident = BmoeStepper({**spec, "kind": "resident"})
    tokens = resident.session.model.tokenize(TEXT)
    if len(tokens) < PROMPT_TOKENS + args.tokens:
        raise SystemExit(
            f"the bench text has {len(tokens)} tokens: at most {len(tokens) - PROMPT_TOKENS} to feed"
        )
    sessions = {"resident": resident, "streamed": _streamed(spec, args.cache_mb, False)}
    if args.pass_too:
        sessions["streamed, pass on"] = _streamed(spec, args.cache_mb, True)
    streamed = sessions["streamed"]
    assert streamed.session.streaming is not None
    expert_mib = streamed.session.streaming.info.expert_bytes / 2**20
    prompt, feed = tokens[:PROMPT_TOKENS], tokens[PROMPT_TOKENS : PROMPT_TOKENS + args.tokens]
    for s in sessions.values():
        s.prefill(prompt)
    before = streamed.session.streaming.counters()
    times: dict[str, list[float]] = {name: [] for name in sessions}
    order = list(sessions.items())
    for i, token in enumerate(feed):
        for name, s in order[i % len(order) :] + order[: i % len(order)]:  # each one first in turn
            t0 = time.perf_counter()
            s.step(token, PROMPT_TOKENS + i)
            times[name].append(time.perf_counter() - t0)
    c = streamed.session.streaming.counters() - before
    passing = sessions.get("streamed, pass on")
    passed = (
        0
        if passing is None or passing.session.streaming is None
        else passing.session.streaming.counters().passed
    )
    a = times["resident"][WARMUP:]
    step = 1e3 * statistics.median(a)
    print(f"{args.model.name}: experts {expert_mib:,.0f} MiB; resident median step {step:.3f} ms")
    for name in list(sessions)[1:]:
        b = times[name][WARMUP:]
        ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
        print(
            f"  {name}: median step {1e3 * statistics.median(b):.3f} ms; per-token ratio "
            f"resident/{name}, median {ratio:.3f} ({len(a)} tokens)"
        )
    print(f"  the streamed decode hit {c.hits}, missed {c.misses}; with passing, {passed} layer calls passed")


def _streamed(spec: dict[str, object], cache_mb: int | None, pass_layers: bool) -> BmoeStepper:
    """A streamed session; without ``cache_mb``, its budget holds every expert."""
    stepper = BmoeStepper(
        {**spec, "kind": "stream", "cache_mib": cache_mb, "routing": {"pass_layers": pass_layers}}
    )
    streaming = stepper.session.streaming
    assert streaming is not None
    if cache_mb is None:
        streaming.set_budget(streaming.info.expert_bytes + streaming.info.entry_bytes)
    return stepper


if __name__ == "__main__":
    main()
