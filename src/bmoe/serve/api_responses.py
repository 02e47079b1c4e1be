"""What the server answers: OpenAI's response bodies and stream chunks, from bmoe's results.

Pure functions from values to JSON-ready dicts: the chat completions dialect's side of the
neutral result (``neutral.Outcome``, a finished generation; ``neutral.Delta``, a streamed
piece of it). bmoe's additions ride in the places OpenAI-compatible servers use:
``reasoning_content`` beside ``content`` (the thinking span, parsed apart) and
``usage.prompt_tokens_details.cached_tokens`` (prompt tokens whose KV was reused).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from bmoe.domain.decide import DecideRequest, DecideResult
from bmoe.domain.generation import TokenChoice, TokenLogprob
from bmoe.requests.neutral import Delta, FinishReason, Outcome

Json = dict[str, Any]


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


def _message(o: Outcome) -> Json:
    """The assistant's message: ``content`` is ``null`` when the reply is only calls."""
    calls_only = bool(o.tool_calls) and not o.text.strip()
    message: Json = {"role": "assistant", "content": None if calls_only else o.text}
    if o.reasoning:
        message["reasoning_content"] = o.reasoning
    if o.tool_calls:
        message["tool_calls"] = [c.as_openai() for c in o.tool_calls]
    return message


def _chat_token(choice: TokenChoice) -> Json:
    return {"token": choice.piece, "logprob": _logp(choice.logprob), "bytes": list(choice.text)}


def chat_logprobs(logprobs: tuple[TokenLogprob, ...] | None) -> Json | None:
    """OpenAI's chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    if logprobs is None:
        return None
    return {
        "content": [
            {**_chat_token(lp.chosen), "top_logprobs": [_chat_token(t) for t in lp.top]} for lp in logprobs
        ],
        "refusal": None,
    }


def text_logprobs(logprobs: tuple[TokenLogprob, ...] | None, offset: int = 0) -> Json | None:
    """The legacy completions' ``logprobs``: parallel lists, ``top_logprobs`` as dicts,
    ``text_offset`` from ``offset`` (the characters before these tokens)."""
    if logprobs is None:
        return None
    offsets = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.chosen.piece)
    return {
        "tokens": [lp.chosen.piece for lp in logprobs],
        "token_logprobs": [_logp(lp.chosen.logprob) for lp in logprobs],
        "top_logprobs": [{t.piece: _logp(t.logprob) for t in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }


def chat_completion(env: Envelope, o: Outcome) -> Json:
    """The body of a ``/v1/chat/completions`` answer (``chat.completion``)."""
    choice = {
        "index": 0,
        "message": _message(o),
        "logprobs": chat_logprobs(o.logprobs),
        "finish_reason": o.finish_reason,
    }
    return env.wrap("chat.completion", choices=[choice], usage=usage(o))


def chat_chunk(
    env: Envelope, delta: Json, finish_reason: FinishReason | None = None, logprobs: Json | None = None
) -> Json:
    """One ``chat.completion.chunk``: the first carries ``{"role": "assistant"}``, the next
    ones ``content`` / ``reasoning_content`` pieces or ``tool_calls``, the last an empty
    delta and the reason."""
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return env.wrap("chat.completion.chunk", choices=[choice])


def chat_delta(d: Delta, first_call: int = 0) -> Json:
    """A streamed piece as a chat chunk's ``delta``; its calls are numbered (``index``)
    from ``first_call``, the calls streamed before them."""
    delta: Json = {}
    if d.reasoning:
        delta["reasoning_content"] = d.reasoning
    if d.text:
        delta["content"] = d.text
    if d.tool_calls:
        delta["tool_calls"] = [{"index": first_call + i, **c.as_openai()} for i, c in enumerate(d.tool_calls)]
    if d.call_deltas:
        delta["tool_calls"] = [c.as_openai() for c in d.call_deltas]
    return delta


def text_completion(env: Envelope, o: Outcome) -> Json:
    """The body of a ``/v1/completions`` answer (``text_completion``)."""
    choice: Json = {
        "text": o.text,
        "index": 0,
        "logprobs": text_logprobs(o.logprobs),
        "finish_reason": o.finish_reason,
    }
    if o.reasoning:
        choice["reasoning_content"] = o.reasoning
    return env.wrap("text_completion", choices=[choice], usage=usage(o))


def text_chunk(
    env: Envelope, d: Delta, finish_reason: FinishReason | None = None, logprobs: Json | None = None
) -> Json:
    """One streamed ``text_completion`` object."""
    choice: Json = {"text": d.text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
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
        **result.prompt_figures(),
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
