"""The human summary lines printed on stderr after a one-shot run (see docs/cli.md)."""

from __future__ import annotations

from bmoe.domain.generation import RunResult


def generation_line(result: RunResult) -> str:
    """``generation:`` tokens generated and decode speed."""
    return (
        f"generation: {len(result.tokens)} tokens, {result.decode_s_tok:.4f} s/token "
        f"({result.tok_s:.1f} tok/s)"
    )


def timing_line(result: RunResult, load_s: float) -> str:
    """``timing:`` model load and prompt prefill."""
    return (
        f"timing: load {load_s:.2f} s, prefill {result.n_prompt} tokens in {result.prefill_s:.3f} s "
        f"({result.prefill_tps:.1f} tok/s)"
    )
