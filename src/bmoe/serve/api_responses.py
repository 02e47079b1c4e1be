"""What the server answers: OpenAI's response bodies and stream chunks, from bmoe's results.

Pure functions from values to JSON-ready dicts. ``Outcome`` is a finished generation as the
API sees it (the text cut at a stop string, why it finished, the token counts); ``Delta`` a
streamed piece of it. bmoe's additions ride in the places OpenAI-compatible servers use:
``reasoning_content`` beside ``content`` (the thinking span, parsed apart) and
``usage.prompt_tokens_details.cached_tokens`` (prompt tokens whose KV was reused).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs

from bmoe.domain.decide import DecideRequest, DecideResult
from bmoe.domain.generation import RunResult

FinishReason = Literal["stop", "length"]
Json = dict[str, Any]


@attrs.frozen
class Outcome:
    """A finished generation: ``text`` (cut at a stop string) and ``reasoning``; why it
    finished (``stop``: an end-of-generation token or a stop string; ``length``:
    ``max_tokens`` or the context); ``prompt_tokens`` (the whole rendered prompt),
    ``cached_tokens`` (of those, the ones whose KV was kept from the previous request) and
    ``completion_tokens`` (generated, the end token not counted)."""

    text: str
    reasoning: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def outcome(result: RunResult, text: str, *, stopped: bool) -> Outcome:
    """The API's view of a finished (not cancelled) ``result``, whose answer was cut to
    ``text``; ``stopped``: a stop string ended it."""
    prompt_tokens = result.n_past - len(result.tokens)
    return Outcome(
        text=text,
        reasoning=result.reasoning,
        finish_reason="stop" if stopped or result.stopped_at_eog else "length",
        prompt_tokens=prompt_tokens,
        completion_tokens=len(result.tokens),
        cached_tokens=prompt_tokens - result.n_prompt,
    )


@attrs.frozen
class Delta:
    """A streamed piece: answer ``text`` and ``reasoning`` it adds (either may be empty)."""

    text: str = ""
    reasoning: str = ""


@attrs.frozen
class Envelope:
    """What every object of one response shares: its ``id``, ``created`` (Unix seconds) and
    the served ``model``."""

    id: str
    created: int
    model: str

    def wrap(self, obj: str, **fields: Any) -> Json:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, **fields}


def usage(o: Outcome) -> Json:
    return {
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    }


def _message(text: str, reasoning: str) -> Json:
    message: Json = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def chat_completion(env: Envelope, o: Outcome) -> Json:
    """The body of a ``/v1/chat/completions`` answer (``chat.completion``)."""
    message = _message(o.text, o.reasoning)
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": o.finish_reason}
    return env.wrap("chat.completion", choices=[choice], usage=usage(o))


def chat_chunk(env: Envelope, delta: Json, finish_reason: FinishReason | None = None) -> Json:
    """One ``chat.completion.chunk``: the first carries ``{"role": "assistant"}``, the next
    ones ``content`` / ``reasoning_content`` pieces, the last an empty delta and the reason."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return env.wrap("chat.completion.chunk", choices=[choice])


def chat_delta(d: Delta) -> Json:
    """A streamed piece as a chat chunk's ``delta``."""
    delta: Json = {}
    if d.reasoning:
        delta["reasoning_content"] = d.reasoning
    if d.text:
        delta["content"] = d.text
    return delta


def text_completion(env: Envelope, o: Outcome) -> Json:
    """The body of a ``/v1/completions`` answer (``text_completion``)."""
    choice: Json = {"text": o.text, "index": 0, "logprobs": None, "finish_reason": o.finish_reason}
    if o.reasoning:
        choice["reasoning_content"] = o.reasoning
    return env.wrap("text_completion", choices=[choice], usage=usage(o))


def text_chunk(env: Envelope, d: Delta, finish_reason: FinishReason | None = None) -> Json:
    """One streamed ``text_completion`` object."""
    choice: Json = {"text": d.text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    if d.reasoning:
        choice["reasoning_content"] = d.reasoning
    return env.wrap("text_completion", choices=[choice])


def usage_chunk(env: Envelope, obj: str, o: Outcome) -> Json:
    """The stream's last chunk when the client asked for ``include_usage``: no choices."""
    return env.wrap(obj, choices=[], usage=usage(o))


def _logp(x: float) -> float | None:
    return x if math.isfinite(x) else None


def decision(env: Envelope, request: DecideRequest, result: DecideResult) -> Json:
    """The body of a ``/v1/decide`` answer: the line protocol's ``BMOE_DECIDE`` keys (a
    log-probability of minus infinity is ``null``; ``-1``: a streaming figure not measured),
    with the ``choices`` echoed."""
    read_mib = result.stream.read_mib if result.stream is not None else -1.0
    io_s = result.stream.io_s if result.stream is not None else -1.0
    return env.wrap(
        "bmoe.decision",
        choices=list(request.choices),
        cancelled=result.cancelled,
        best=result.best,
        choice_logp=[_logp(x) for x in result.choice_logp],
        n_tokens=result.n_tokens,
        n_reused=result.n_reused,
        n_prefilled=result.n_prefilled,
        restore_s=result.restore_s,
        store_s=result.store_s,
        prefill_s=result.prefill_s,
        prefill_tps=result.prefill_tps,
        prefill_read_mib=read_mib,
        prefill_io_s=io_s,
        prefix_state_mib=result.prefix_state_mib,
        choice_p_renorm=[float(p) for p in result.choice_p_renorm],
        prefix_plan=result.prefix_plan,
    )


@attrs.frozen
class ModelCard:
    """The one model a server serves, as ``/v1/models`` lists it; ``meta`` is bmoe's
    (architecture, context length, experts, thinking control, decisions, streaming)."""

    id: str
    created: int
    meta: Json = attrs.field(factory=dict)

    def body(self) -> Json:
        return {
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": "bmoe",
            "meta": self.meta,
        }


def model_list(card: ModelCard) -> Json:
    return {"object": "list", "data": [card.body()]}
