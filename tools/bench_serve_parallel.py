"""Benchmark (not a test): four clients streaming at once against ``python -m bmoe.serve``
with ``-np 1`` and ``-np 4`` (both servers up, rounds interleaved): the first client's and
the last client's time to first token, and the time until all four are answered (medians).

    python tools/bench_serve_parallel.py MODEL [--rounds N] [--tokens N]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import openai

QUESTIONS = [
    "Hello there, how are you today?",
    "What is the weather like in Paris?",
    "Tell me a story about a fox.",
    "Count to ten slowly.",
]
Times = dict[int, tuple[float, float]]  # client: (first token, whole answer), seconds


def start(model: str, n: int) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "bmoe.serve", "-m", model, "-c", "2048", "-np", str(n)]
    argv += ["--port", "0", "--log-level", "warning", "--profile", "off"]
    env = {**os.environ, "BMOE_BUSY_WARNING": "0"}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        found = re.search(r"on (http://\S+/v1)", line)
        if found:
            return proc, found.group(1)
        if not line and proc.poll() is not None:
            raise SystemExit(f"the server with -np {n} did not start")


def one_round(url: str, tokens: int) -> Times:
    times: Times = {}
    go = threading.Barrier(len(QUESTIONS))

    def client(i: int) -> None:
        api = openai.OpenAI(base_url=url, api_key="unused")
        messages = [{"role": "user", "content": QUESTIONS[i]}]
        go.wait()
        t0 = time.perf_counter()
        first = None
        for chunk in api.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=tokens,
            stream=True,
            temperature=0,  # type: ignore[arg-type]
        ):
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t0
        times[i] = (first if first is not None else 0.0, time.perf_counter() - t0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    servers = {n: start(args.model, n) for n in (1, 4)}
    rounds: dict[int, list[Times]] = {n: [] for n in servers}
    try:
        for _, url in servers.values():
            one_round(url, args.tokens)  # warm
        for _ in range(args.rounds):
            for n, (_, url) in servers.items():
                rounds[n].append(one_round(url, args.tokens))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    for n, runs in rounds.items():
        first = statistics.median(min(t[0] for t in r.values()) for r in runs) * 1000
        last = statistics.median(max(t[0] for t in r.values()) for r in runs) * 1000
        total = statistics.median(max(t[1] for t in r.values()) for r in runs) * 1000
        print(
            f"-np {n}: first token {first:.0f} ms (first client), {last:.0f} ms (last client); "
            f"all four answered in {total:.0f} ms (median of {args.rounds})"
        )


if __name__ == "__main__":
    main()
