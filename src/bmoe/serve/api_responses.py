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
from bmoe.domain.generation import RunResult, TokenChoice, TokenLogprob
from bmoe.domain.tools import ToolCall
from bmoe.domain.tools.call_stream import CallDelta

FinishReason = Literal["stop", "length", "tool_calls"]
Json = dict[str, Any]


@attrs.frozen
class Outcome:
    """A finished generation: ``text`` (cut at a stop string) and ``reasoning``; why it
    finished (``stop``: an end-of-generation token or a stop string; ``length``:
    ``max_tokens`` or the context); ``prompt_tokens`` (the whole rendered prompt),
    ``cached_tokens`` (of those, the ones whose KV was kept from the previous request) and
    ``completion_tokens`` (generated, the end token not counted); the ``tool_calls`` the
    reply made (then ``finish_reason`` is ``tool_calls``) and the tokens' ``logprobs``
    when they were asked for."""

    text: str
    reasoning: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None


def outcome(result: RunResult, text: str, *, stopped: bool, logprobs: bool = False) -> Outcome:
    """The API's view of a finished (not cancelled) ``result``, whose answer was cut to
    ``text``; ``stopped``: a stop string ended it; ``logprobs``: they were asked for."""
    prompt_tokens = result.n_past - len(result.tokens)
    finish: FinishReason = "stop" if stopped or result.stopped_at_eog else "length"
    return Outcome(
        text=text,
        reasoning=result.reasoning,
        finish_reason="tool_calls" if result.tool_calls and finish == "stop" else finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(result.tokens),
        cached_tokens=prompt_tokens - result.n_prompt,
        tool_calls=result.tool_calls,
        logprobs=result.logprobs if logprobs else None,
    )


@attrs.frozen
class Delta:
    """A streamed piece: answer ``text`` and ``reasoning`` it adds (either may be empty),
    the ``logprobs`` of the tokens generated since the previous piece (when asked for) and,
    at the end of a reply, its ``tool_calls``; or ``call_deltas``, pieces of calls streamed
    as they are written (``CallStreamer``)."""

    text: str = ""
    reasoning: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    call_deltas: tuple[CallDelta, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.logprobs or self.tool_calls or self.call_deltas)


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
