"""The server's totals since it started, and ``GET /metrics`` in Prometheus' text format.

``ServedTotals`` is fed by the served session (each generated token's ``Progress``, each
finished generation's ``RunResult``; any thread, under its lock). ``prometheus_text``
writes them with llama.cpp's server's metric names where it has one (``llamacpp:``
prefix: prompt and generated tokens and their seconds, tokens per second, requests
processing and deferred) and bmoe's own for the expert stream (``bmoe:``: cache hits and
misses and the hit ratio, MiB read, the compute's wait for reads; with ``--draft copy``
the verifies and the tokens drafted and accepted).
"""

from __future__ import annotations

import threading

import attrs

from bmoe.domain.generation import Progress, RunResult

MIB = 1 << 20


@attrs.define
class _Figures:
    requests: int = 0
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    generated_tokens: int = 0
    generated_s: float = 0.0
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    read_wait_s: float = 0.0
    draft_verifies: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0


class ServedTotals:
    """What the server computed since it started (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures = _Figures()

    def token(self, p: Progress) -> None:
        """One generated token (its expert stream's activity since the previous one)."""
        if p.stream is None:
            return
        with self._lock:
            f = self._figures
            f.hits += p.stream.hits
            f.misses += p.stream.misses
            f.bytes_read += p.stream.bytes_read
            f.read_wait_s += p.stream.stall_s

    def finished(self, result: RunResult) -> None:
        """One generation ended: its prompt tokens computed (after reuse) and generated."""
        with self._lock:
            f = self._figures
            f.requests += 1
            f.prompt_tokens += result.n_prompt
            f.prompt_s += result.prefill_s
            f.generated_tokens += len(result.tokens)
            f.generated_s += result.decode_s
            if (d := result.drafts) is not None:
                f.draft_verifies += d.verifies
                f.draft_tokens += d.drafted
                f.draft_accepted += d.accepted
            if result.stream is not None:
                prefill = result.stream.prefill
                f.hits += prefill.hits
                f.misses += prefill.misses
                f.bytes_read += prefill.bytes_read
                f.read_wait_s += prefill.stall_s

    def figures(self) -> _Figures:
        with self._lock:
            return attrs.evolve(self._figures)


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def prometheus_text(
    totals: ServedTotals, processing: int, deferred: int, streaming: bool, drafting: bool = False
) -> str:
    """``GET /metrics``: each metric's ``# HELP`` and ``# TYPE`` line, then its value."""
    f = totals.figures()
    rows: list[tuple[str, str, str, float]] = [
        (
            "llamacpp:prompt_tokens_total",
            "counter",
            "Prompt tokens computed (after KV reuse).",
            f.prompt_tokens,
        ),
        ("llamacpp:prompt_seconds_total", "counter", "Prompt computing time.", f.prompt_s),
        ("llamacpp:tokens_predicted_total", "counter", "Tokens generated.", f.generated_tokens),
        ("llamacpp:tokens_predicted_seconds_total", "counter", "Generation time.", f.generated_s),
        ("llamacpp:n_decode_total", "counter", "Generations finished.", f.requests),
        (
            "llamacpp:prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            _rate(f.prompt_tokens, f.prompt_s),
        ),
        (
            "llamacpp:predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            _rate(f.generated_tokens, f.generated_s),
        ),
        ("llamacpp:requests_processing", "gauge", "Requests being processed.", processing),
        ("llamacpp:requests_deferred", "gauge", "Requests waiting for a slot.", deferred),
    ]
    if streaming:
        lookups = f.hits + f.misses
        rows += [
            ("bmoe:expert_cache_hits_total", "counter", "Expert requests served from the cache.", f.hits),
            ("bmoe:expert_cache_misses_total", "counter", "Expert requests read from the file.", f.misses),
            (
                "bmoe:expert_cache_hit_ratio",
                "gauge",
                "Hits over expert requests, since the server started.",
                f.hits / lookups if lookups else 0.0,
            ),
            (
                "bmoe:expert_read_mib_total",
                "counter",
                "MiB of experts read from the file.",
                f.bytes_read / MIB,
            ),
            (
                "bmoe:expert_read_wait_seconds_total",
                "counter",
                "Time the compute waited for reads.",
                f.read_wait_s,
            ),
        ]
    if drafting:
        rows += [
            ("bmoe:draft_verifies_total", "counter", "Batches verifying a copy draft.", f.draft_verifies),
            ("bmoe:draft_tokens_total", "counter", "Tokens drafted (--draft copy).", f.draft_tokens),
            (
                "bmoe:draft_tokens_accepted_total",
                "counter",
                "Drafted tokens the model kept.",
                f.draft_accepted,
            ),
        ]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
    return "\n".join(lines) + "\n"
