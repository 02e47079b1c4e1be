"""Which ways of filling the KV cache leave a prompt's last logits bit for bit the same.

One context (``-np 2``: a unified KV cache, as the server's), 300 random tokens of the tiny
model's vocabulary; their last logits row prefilled in one batch is the reference, then:

- the same tokens prefilled in other chunkings (split at 137, at 200, at 64/128/200);
- 64 of them (or 1) decoded one per step, the rest in a batch (a kept reply's cells);
- 6 or 64 decoded one per step, then cut (``remove_from``) and prefilled again in a batch
  (what a slot does with its reply since the slots cut it);
- the same tokens after another sequence's 50 cells (placed where that one left room).

Prints ``equal`` or the largest difference of each. What docs/parallel.md says of slots that
cut their reply, and why two conversations sharing steps differ in the last bits, rests on
it (measured 2026-12-04 on qwen3moe: chunkings and step-then-cut equal; 64 steps kept 5.0e-5;
after another sequence's cells 3.6e-5).

    python tools/kv_exactness.py [--model qwen3moe] [--streamed]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from bmoe.adapters.llama import ContextParams
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures import fixture_path

Row = np.ndarray


def verdict(base: Row, other: Row) -> str:
    return "equal" if np.array_equal(base, other) else f"differs by {np.abs(base - other).max():.2g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3moe", help="a tiny fixture's name (default qwen3moe)")
    p.add_argument("--streamed", action="store_true", help="experts streamed (a 64 MiB cache)")
    args = p.parse_args()
    context = ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=2, n_seq_max=2)
    config = SessionConfig(
        model_path=fixture_path(args.model, 0),
        context=context,
        stream=StreamConfig(enabled=args.streamed, cache_mb=64),
    )
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(10, 200, size=300)]
    with Session.open(config) as s:
        ctx = s.ctx

        def fill(splits: Sequence[int], one_by_one: int | None = None) -> Row:
            """``tokens`` in chunks ending at ``splits``; the chunk from ``one_by_one`` a token
            a step."""
            ctx.clear()
            start = 0
            for end in [*splits, len(tokens)]:
                if start == one_by_one:
                    for pos in range(start, end):
                        ctx.decode([tokens[pos]], pos)
                else:
                    ctx.decode(tokens[start:end], start)
                start = end
            return np.array(ctx.logits(-1), copy=True)

        base = fill([])
        for splits in ([137], [200], [64, 128, 200]):
            print(f"prefilled in chunks ending at {splits}: {verdict(base, fill(splits))}")
        for steps in (1, 64):
            print(f"{steps} decoded a token a step, kept: {verdict(base, fill([200, 200 + steps], 200))}")
        for steps in (6, 64):
            ctx.clear()
            ctx.decode(tokens[:200], 0)
            for pos in range(200, 200 + steps):
                ctx.decode([tokens[pos]], pos)
            assert ctx.remove_from(200)
            ctx.decode(tokens[200:], 200)
            print(f"{steps} decoded a token a step, cut, prefilled again: {verdict(base, ctx.logits(-1))}")
        ctx.clear()
        ctx.decode([int(t) for t in rng.integers(10, 200, size=50)], 0, seq=1)
        ctx.decode(tokens, 0, seq=0)
        print(f"after another sequence's 50 cells: {verdict(base, ctx.logits(-1))}")


if __name__ == "__main__":
    main()
