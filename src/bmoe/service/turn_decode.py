"""One turn's decode: tokens drawn one by one (or drafted and verified) until the end of
generation, ``n_predict``, a stop or a cancel, their text split from their reasoning, and
the ``RunResult`` the turn's bookkeeping becomes.

Runs over ``IGenerateBackend`` only; ``SessionEngine`` prefills the prompt first and keeps
the conversation after.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable

import attrs

from bmoe.domain.generation import GenerateRequest, Progress, RunResult, TokenLogprob
from bmoe.domain.reasoning import Delta, ReasoningSplitter
from bmoe.domain.tools import ToolCall, ToolUse
from bmoe.ports.generate_backend import IGenerateBackend
from bmoe.service.copy_drafts import Drafting

OnProgress = Callable[[Progress], None]


class TurnCancelled(Exception):
    """The turn's cancel was seen at a decode boundary."""


@attrs.define
class Turn:
    """Mutable bookkeeping of one generate."""

    prompt: list[int]
    n_predict: int
    keep: int = 0
    restored: int = 0  # of ``keep``, the tokens a state from the prompt cache held
    tokens: list[int] = attrs.Factory(list)
    text: list[str] = attrs.Factory(list)
    reasoning: list[str] = attrs.Factory(list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stopped_at_eog: bool = False
    logprobs: list[TokenLogprob] = attrs.Factory(list)
    tool_calls: tuple[ToolCall, ...] = ()
    drafting: Drafting | None = None  # copy drafts (service.copy_drafts), None: plain steps


def decode(
    backend: IGenerateBackend,
    turn: Turn,
    kv_tokens: list[int],
    request: GenerateRequest,
    on_progress: OnProgress | None,
    *,
    cancel: threading.Event,
    stop: threading.Event,
) -> None:
    """Draw the turn's tokens after its prefill, each fed back (``kv_tokens``, what the
    backend's memory holds, grows with them in place). ``stop`` ends it after the token being
    decoded, keeping what it generated; ``cancel`` raises ``TurnCancelled`` at the next
    boundary."""
    specials = ToolUse.shown(request.tools) is not None  # call syntaxes use control tokens
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    splitter = ReasoningSplitter()
    t_start = t_tok = time.perf_counter()
    drafting = turn.drafting
    try:
        while len(turn.tokens) < turn.n_predict and not stop.is_set():
            if cancel.is_set():
                raise TurnCancelled
            token = backend.sample() if drafting is None else drafting.next_token(backend.sample)
            if backend.is_eog(token):
                turn.stopped_at_eog = True
                break
            turn.tokens.append(token)
            logprob = None
            if request.logprobs is not None:
                logprob = backend.token_logprob(token, request.logprobs)
                turn.logprobs.append(logprob)
            delta = splitter.feed(utf8.decode(backend.token_bytes(token, special=specials)))
            add(turn, delta)
            if on_progress is not None:
                now = time.perf_counter()
                wall_ms, t_tok = (now - t_tok) * 1000.0, now  # since the previous token
                on_progress(
                    Progress(
                        step=len(turn.tokens),
                        steps=turn.n_predict,
                        wall_ms=wall_ms,
                        delta_text=delta.text,
                        delta_reasoning=delta.reasoning,
                        logprob=logprob,
                        drafts=None if drafting is None else attrs.evolve(drafting.report),
                    )
                )
            if len(turn.tokens) < turn.n_predict and not stop.is_set():
                if drafting is not None:  # alone or with a draft, unless a verify fed it
                    drafting.emitted(token)
                    drafting.feed(backend, token, kv_tokens, turn.n_predict - len(turn.tokens) - 1)
                else:
                    backend.feed([token], len(kv_tokens))
                    kv_tokens.append(token)
        if drafting is not None and turn.tokens:  # the KV as plain steps leave it
            want = len(turn.prompt) + len(turn.tokens) - (0 if turn.stopped_at_eog else 1)
            drafting.settle(backend, kv_tokens, want)
    finally:
        turn.decode_s = time.perf_counter() - t_start
        add(turn, splitter.feed(utf8.decode(b"", final=True)))
        add(turn, splitter.finish())


def add(turn: Turn, delta: Delta) -> None:
    """Append a piece of the reply to the turn's text and reasoning."""
    if delta.text:
        turn.text.append(delta.text)
    if delta.reasoning:
        turn.reasoning.append(delta.reasoning)


def turn_result(turn: Turn, *, held: int, cancelled: bool) -> RunResult:
    """What the turn produced; ``held``: the tokens the backend's memory holds after it (the
    position a cancelled turn left)."""
    return RunResult(
        text="".join(turn.text),
        reasoning="".join(turn.reasoning),
        tokens=tuple(turn.tokens),
        n_prompt=len(turn.prompt) - turn.keep,
        n_restored=turn.restored,
        n_past=len(turn.prompt) + len(turn.tokens) if not cancelled else held,
        prefill_s=turn.prefill_s,
        decode_s=turn.decode_s,
        cancelled=cancelled,
        stopped_at_eog=turn.stopped_at_eog,
        tool_calls=turn.tool_calls,
        logprobs=tuple(turn.logprobs),
        drafts=turn.drafting.report if turn.drafting is not None else None,
    )
