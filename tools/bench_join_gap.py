"""A long prompt joins a running ``-np 2`` batch: how long the running stream waits.

One stream generates ``--gen`` tokens; at its ``--join-at``-th token a prompt of about
``--prompt-tokens`` tokens joins (``Session.run_parallel``, the server's ``-np 2``). The
joining prompt is prefilled in chunks that share the running stream's steps (chunked
joins), so the stream keeps getting a token every step. Reported: the stream's median
time between two tokens before the join, its longest gap while the prompt is prefilled,
their ratio, the steps the prompt took, and the joining request's time to first token.
Time figures move with the machine: run nothing else meanwhile.

    python tools/bench_join_gap.py -m model.gguf --cache-mb 512 --prompt-tokens 2000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from bench_agent_turns import (
    Sink,
    filler,
    session_flags,
    stream_config,
)  # a sibling: run as python tools/...

from bmoe import GenerateRequest, Session, SessionConfig
from bmoe.adapters.llama import ContextParams
from bmoe.bench.prefill import context_batch
from bmoe.domain.chat import ChatMessage
from bmoe.service.parallel_jobs import ParallelEntry
from bmoe.tinymodel import default_model_path


def run(args: argparse.Namespace) -> None:
    context = ContextParams(
        n_ctx=args.ctx,
        n_batch=context_batch(args.batch),
        n_ubatch=context_batch(args.batch),
        n_threads=args.threads,
        n_seq_max=2,
    )
    stream = stream_config(args)
    config = SessionConfig(model_path=args.model, context=context, chat=True, think=False, stream=stream)
    system = ChatMessage("system", "You are a coding agent.")
    with Session.open(config) as s:
        text = filler(args.prompt_tokens, s.model.tokenize_prompt, 0)
        runner, joiner = Sink(), Sink()
        entries = {
            "runner": ParallelEntry(
                GenerateRequest("Tell a long story", n_predict=args.gen), runner, history=[system]
            ),
            "joiner": ParallelEntry(GenerateRequest(text, n_predict=4), joiner, history=[system]),
        }
        joined_at = [0.0]

        def take(idle: bool) -> Sequence[ParallelEntry]:
            if not runner.at and not joined_at[0] and "runner" in entries:
                return [entries.pop("runner")]
            if len(runner.at) >= args.join_at and "joiner" in entries:
                joined_at[0] = time.perf_counter()
                return [entries.pop("joiner")]
            return []

        s.run_parallel(take)
    steps = list(zip(runner.at, runner.at[1:], strict=False))  # (a token, the next) of the stream
    first = joiner.at[0]
    before = [b - a for a, b in steps if b <= joined_at[0]]
    during = [b - a for a, b in steps if b > joined_at[0] and a < first]  # the gaps the join touched
    median = statistics.median(before)
    longest = max(during) if during else 0.0
    n_prompt = joiner.results[0].n_prompt
    how = "resident" if args.cache_mb is None else f"streamed, cache {args.cache_mb} MiB"
    print(
        f"model {args.model.name}, {how}, -b {args.batch}, a {n_prompt}-token prompt joining at the "
        f"stream's token {args.join_at}"
    )
    print(
        "| stream's median step before the join | longest gap while the prompt joins | ratio "
        "| stream tokens during the join | joiner's first token |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {median:.3f} s | {longest:.3f} s | {longest / median:.2f} | {len(during)} | "
        f"{first - joined_at[0]:.2f} s |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    session_flags(p, ctx=4096)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--gen", type=int, default=160)
    p.add_argument("--join-at", type=int, default=8)
    args = p.parse_args()
    args.model = args.model or default_model_path()
    run(args)


if __name__ == "__main__":
    main()
