"""The one request and the one result every chat dialect maps to.

Chat completions (``api_requests``), OpenAI's Responses API and Anthropic's Messages API
(``bmoe.serve``'s ``responses_requests`` and ``messages_requests``) each read their body
into a ``ChatRequest``: the conversation as chat messages (text content, the calls an
assistant made, the results of those calls), the tools and the tool choice, the output
constraint, the sampling, the limits, the thinking switch and the stop strings. The session
runs it one way whatever the dialect: the prompt rendered by the chat template, tool replies
parsed in one place (``ReplyStream``), the pieces streamed as ``Delta`` values. What comes
back is one ``Outcome`` (text, reasoning, tool calls, why it finished, the token counts),
which each dialect writes in its own shape (``bmoe.serve``'s ``api_responses``,
``responses_replies``, ``messages_replies``).

Pure values: no HTTP, no session.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.generation import RunResult, TokenLogprob
from bmoe.domain.tools import ToolCall, ToolUse
from bmoe.domain.tools.call_stream import CallDelta
from bmoe.errors import RequestError

FinishReason = Literal["stop", "length", "tool_calls"]


@attrs.frozen(kw_only=True)
class Sampling:
    """The sampling a request asks for; ``None`` leaves a setting to the server's defaults.

    ``temperature`` 0 is greedy; ``top_k`` is an extension (llama.cpp's and vLLM's name).
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    knobs: dict[str, Any] = attrs.field(factory=dict)  # penalties and logit_bias, when set


@attrs.frozen(kw_only=True)
class Generation:
    """What every generation request shares.

    - ``max_tokens``: most tokens to generate; ``None``: the server's default;
    - ``stop``: stop strings (generation stops at the first, which is cut from the text);
    - ``stream``: answer with server-sent events; ``include_usage``: end the stream with a
      chunk carrying the usage (OpenAI's ``stream_options.include_usage``);
    - ``constraint``: a response format or a grammar; ``logprobs``: ``None`` or how many
      alternatives to list per token;
    - ``fit_context``: ``max_tokens`` is a most, cut to what the prompt leaves of the context
      (Anthropic's ``max_tokens`` and the Responses API's ``max_output_tokens``, which coding
      agents set past a local model's context); else a prompt plus ``max_tokens`` past the
      context is refused (chat completions, as OpenAI does);
    - ``draft``: False turns copy drafts off for this request where the server drafts
      (``--draft copy``): llama.cpp's ``speculative.n_max`` of 0.
    """

    model: str | None = None
    max_tokens: int | None = None
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    constraint: OutputConstraint | None = None
    logprobs: int | None = None
    fit_context: bool = False
    draft: bool = True


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A chat turn, whichever dialect asked it: the whole conversation, ending with a user
    message or a tool's result.

    ``think``: render the turn with thinking on or off; ``None``: the server's setting.
    ``tools``: what the model may call (``None``: no tools offered).
    """

    messages: tuple[ChatMessage, ...]
    think: bool | None = None
    generation: Generation = Generation()
    tools: ToolUse | None = None

    def __attrs_post_init__(self) -> None:
        if not self.messages or self.messages[-1].role not in ("user", "tool"):
            raise RequestError("the last message must be a user message or a tool's result", "messages")


@attrs.frozen
class Outcome:
    """A finished generation: ``text`` (cut at a stop string) and ``reasoning``; why it
    finished (``stop``: an end-of-generation token or a stop string; ``length``:
    ``max_tokens`` or the context); ``prompt_tokens`` (the whole rendered prompt),
    ``cached_tokens`` (of those, the ones whose KV was kept from the previous request) and
    ``completion_tokens`` (generated, the end token not counted); the ``tool_calls`` the
    reply made (then ``finish_reason`` is ``tool_calls``), the tokens' ``logprobs`` when
    they were asked for, and the ``stop_string`` that ended it, if one did; ``prefill_s`` and
    ``decode_s``, the seconds its prompt's prefill and its decode took (Ollama reports them)."""

    text: str
    reasoning: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    stop_string: str | None = None
    prefill_s: float = attrs.field(default=0.0, eq=False)  # timings: two equal replies differ in them
    decode_s: float = attrs.field(default=0.0, eq=False)


def outcome(
    result: RunResult, text: str, *, stopped: bool, logprobs: bool = False, stop_string: str | None = None
) -> Outcome:
    """The API's view of a finished (not cancelled) ``result``, whose answer was cut to
    ``text``; ``stopped``: a stop string (``stop_string``) ended it; ``logprobs``: they were
    asked for."""
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
        stop_string=stop_string if stopped else None,
        prefill_s=result.prefill_s,
        decode_s=result.decode_s,
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
