"""``run_decide``: one decision start to finish (spec/decide.md), over the ports only.

1. Plan, touching no memory: render and tokenize the prompt, tokenize the choices, refuse
   (a ``DecideRefusedError``) what cannot be answered, find where the prefix ends.
2. Restore the longest kept state the prefix equals or extends, else empty the memory.
3. Prefill what the kept state lacks of the prefix, copy the state there, prefill the rest;
   or, where the piece policy says a second piece costs more than the kept state saves
   (``auto`` with measured ``costs``: ``bmoe.domain.decide.piece_policy``), all of it in one
   piece, keeping nothing new.
4. Keep the copied state (only now: a cancelled or failed decision stores nothing), score.

After any failure the memory is emptied; the kept states stay valid (they are copies).

With a probe (``--decide-probe``), it observes steps 2-3 only (restoring computes nothing),
and an answered decision appends one record; a refused, cancelled or failed one appends none.

``Decider`` is a session's decisions: ``run_decide`` as a request in flight of its engine;
streamed, the result carries its reads and an answered decision teaches the piece costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from bmoe.domain.decide.choice_scorer import first_tokens, score_choices
from bmoe.domain.decide.piece_policy import PieceCosts, PieceMeter, choose_pieces
from bmoe.domain.decide.prefix_cache import IPrefixCache, StateBlob
from bmoe.domain.decide.probe import probe_record
from bmoe.domain.decide.prompt_split import split_prefix
from bmoe.domain.decide.values import MIB, DecideConfig, DecidePlan, DecideRequest, DecideResult
from bmoe.domain.media import Image
from bmoe.domain.streaming import StreamCounters
from bmoe.errors import DecideDisabledError, DecideOverflowError, DecideRefusedError, DecodeAbortedError
from bmoe.ports.decide_backend import IDecideBackend
from bmoe.ports.decide_probe import IDecideProbe
from bmoe.service.session_engine import OnBegin, SessionEngine

DECIDE_DISABLED = "decide is not enabled in this session (start it with --decide)"


def plan_decision(backend: IDecideBackend, request: DecideRequest, *, split: bool) -> DecidePlan:
    """The prompt's tokens, the choices' scored tokens and (with ``split``) the prefix length.

    Raises ``ChoiceError``/``ChoiceCollisionError``, ``DecideOverflowError``,
    ``DecideRefusedError`` (a prompt of no tokens); the memory is not touched.
    """
    choice_tokens = first_tokens(
        request.choices, [backend.tokenize(choice, special=False) for choice in request.choices]
    )
    tokens = _tokens(backend, request.text, request.images)
    if not tokens:
        raise DecideRefusedError("the decision's prompt tokenizes to nothing")
    if len(tokens) > backend.n_ctx:
        raise DecideOverflowError(
            f"the decision's prompt ({len(tokens)} tokens) exceeds the context of {backend.n_ctx} tokens"
        )
    n_prefix = 0
    if split and request.prefix:
        n_prefix = split_prefix(tokens, _tokens(backend, request.prefix, request.prefix_images))
    return DecidePlan(tuple(tokens), n_prefix, choice_tokens)


def _tokens(backend: IDecideBackend, message: str, images: Sequence[Image]) -> list[int]:
    """The rendered user message's tokens, its images as rows."""
    if images:
        return backend.tokenize_media(backend.render(message), images)
    return backend.tokenize(backend.render(message), special=True)


@attrs.define
class _Run:
    """Mutable bookkeeping of one decision."""

    plan: DecidePlan
    n_reused: int = 0
    n_prefilled: int = 0
    restore_s: float = 0.0
    store_s: float = 0.0
    prefill_s: float = 0.0
    pending: StateBlob | None = None
    prefix_plan: str = ""


def _restore(backend: IDecideBackend, cache: IPrefixCache, run: _Run) -> int:
    """Put back the best kept state for the prefix; the position to prefill from."""
    n_prefix = run.plan.n_prefix
    kept = cache.lookup(run.plan.tokens[:n_prefix]) if n_prefix else None
    if kept is None:
        backend.reset()
        return 0
    t0 = time.perf_counter()
    loaded = backend.load_state(kept.blob)
    run.restore_s = time.perf_counter() - t0
    if not loaded:  # the memory is empty now; a state that does not load is no use kept
        cache.discard(kept.tokens)
        return 0
    run.n_reused = len(kept.tokens)
    return run.n_reused


def _prefill(backend: IDecideBackend, run: _Run, start: int, stop: int) -> None:
    t0 = time.perf_counter()
    try:
        backend.prefill(run.plan.tokens[start:stop], start)
    finally:
        run.prefill_s += time.perf_counter() - t0
    run.n_prefilled += stop - start


def _save(backend: IDecideBackend, run: _Run) -> None:
    t0 = time.perf_counter()
    run.pending = backend.save_state()
    run.store_s = time.perf_counter() - t0


def _result(
    run: _Run, cache: IPrefixCache, best: int, logp: tuple[float, ...], *, stored: int, cancelled: bool
) -> DecideResult:
    return DecideResult(
        best=best,
        choice_logp=logp,
        n_reused=run.n_reused,
        n_prefilled=run.n_prefilled,
        n_stored=stored,
        restore_s=run.restore_s,
        store_s=run.store_s,
        prefill_s=run.prefill_s,
        prefix_state_mib=cache.nbytes / MIB,
        cancelled=cancelled,
        prefix_plan=run.prefix_plan,
    )


def run_decide(
    backend: IDecideBackend,
    cache: IPrefixCache,
    request: DecideRequest,
    config: DecideConfig,
    probe: IDecideProbe | None = None,
    costs: PieceCosts | None = None,
) -> DecideResult:
    """Answer one decision. Refusals (``DecideRefusedError`` and its kinds) come before
    anything is prefilled, with memory and kept states untouched. A cancel returns a result
    with ``cancelled`` set; another failure is raised. Either way the memory is emptied and
    nothing is stored. ``probe`` observes the prefills and records an answered decision.
    ``costs``: what the session measured a piece to cost (``auto`` then weighs keeping a new
    prefix state against prefilling in one piece); None keeps it whenever there is one."""
    if not config.enabled:
        raise DecideDisabledError(DECIDE_DISABLED)
    keep = config.keeps_prefix and request.reuse_prefix
    run = _Run(plan_decision(backend, request, split=keep))
    n_prefix, n_tokens = run.plan.n_prefix, len(run.plan.tokens)
    if probe is not None:
        probe.begin()
    try:
        if keep:
            start = _restore(backend, cache, run)
        else:
            backend.reset()
            start = 0
        split = keep and n_prefix > start
        if split and config.prefix_cache == "auto" and costs is not None:
            choice = choose_pieces(start, n_prefix, n_tokens, costs)
            run.prefix_plan, split = choice.why, choice.keep
        if split:
            _prefill(backend, run, start, n_prefix)
            _save(backend, run)
            start = n_prefix
        _prefill(backend, run, start, n_tokens)
    except DecodeAbortedError:
        backend.reset()
        return _result(run, cache, -1, (), stored=0, cancelled=True)
    except BaseException:
        backend.reset()
        raise
    finally:
        if probe is not None:
            probe.end()
    stored = 0
    if run.pending is not None:
        cache.store(run.plan.tokens[:n_prefix], run.pending)
        stored = n_prefix
    scores = score_choices(backend.logits(), run.plan.choice_tokens)
    result = _result(run, cache, scores.best, scores.logp, stored=stored, cancelled=False)
    if probe is not None:
        observed = probe.observation(run.plan.choice_tokens)
        probe.write(probe_record(observed, request.choices, result))
    return result


class StreamReads(Protocol):
    """The streamer's side of a decision (``StreamingControl`` is one)."""

    def counters(self) -> StreamCounters:
        """The streaming counters now."""
        ...

    def end_turn(self) -> None:
        """A request ended (its figures and traces are closed)."""
        ...


@attrs.define
class Decider:
    """One session's decisions over ``backend``, keeping prefix states in ``cache``, run as
    requests in flight of ``engine``. Streamed (``streaming`` and ``meter`` given), each
    decision weighs its pieces with the costs ``meter`` measured (against the budget now),
    its result carries its reads, an answered one teaches ``meter``, and ``after`` follows."""

    engine: SessionEngine
    backend: IDecideBackend
    cache: IPrefixCache
    config: DecideConfig
    probe: IDecideProbe | None = None
    streaming: StreamReads | None = None
    meter: PieceMeter | None = None
    after: Callable[[], None] | None = None

    def decide(self, request: DecideRequest, on_begin: OnBegin | None = None) -> DecideResult:
        """``run_decide`` once the engine is free (``on_begin`` then)."""

        def run(costs: PieceCosts | None) -> DecideResult:
            def work() -> DecideResult:
                return run_decide(self.backend, self.cache, request, self.config, self.probe, costs)

            return self.engine.run_exclusive(work, on_begin)

        streaming, meter = self.streaming, self.meter
        if streaming is None or meter is None:
            return run(None)
        before = streaming.counters()
        result = run(meter.costs(before.budget_bytes))
        delta = streaming.counters() - before
        result = attrs.evolve(result, stream=delta)
        streaming.end_turn()
        if not result.cancelled:
            meter.observe(result.n_prefilled, result.prefill_s, delta.stall_s, delta.bytes_read)
        if self.after is not None:
            self.after()
        return result
