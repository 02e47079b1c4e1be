"""OpenAI requests as bmoe's: ``GenerateRequest``, ``SamplingParams`` and the conversation.

A chat request carries the whole conversation; the session is asked to continue it with
``clear_kv=False`` and the conversation before the last user message as its ``history``, so
the context keeps the longest token prefix it shares with what the previous request left
in memory (the whole earlier conversation when the client extends it, a shared system
prompt when it starts another) and prefills only the rest. A text completion is raw text
and starts from an empty context.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.errors import RequestError
from bmoe.requests.api_requests import CompletionRequest
from bmoe.requests.neutral import ChatRequest, Sampling


@attrs.frozen
class ServeDefaults:
    """What a request leaves unsaid: the sampling (the CLI's ``--temp``, ``--top-k``,
    ``--top-p``, ``--seed``) and ``max_tokens`` (``None``: until the context is full)."""

    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    max_tokens: int | None = None


@attrs.frozen
class ChatTurn:
    """A chat request for the session: ``request.prompt`` is the last user message,
    ``history`` the conversation before it (system prompt included)."""

    history: tuple[ChatMessage, ...]
    request: GenerateRequest
    most: int | None = None  # with no n_predict: the most tokens, if the context leaves them


def sampling_params(asked: Sampling, defaults: SamplingParams) -> SamplingParams:
    """The request's sampling, each setting it leaves unsaid taken from ``defaults``."""

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    return SamplingParams(
        temp=pick(asked.temperature, defaults.temp),
        top_k=defaults.top_k if asked.top_k is None else asked.top_k,
        top_p=pick(asked.top_p, defaults.top_p),
        seed=defaults.seed if asked.seed is None else asked.seed,
        **asked.knobs,
    )


def chat_turn(asked: ChatRequest, defaults: ServeDefaults) -> ChatTurn:
    """The session's turn for a chat request (continuing what the context holds): the
    last message, a user's or a tool's result, is the prompt."""
    *history, last = asked.messages
    if not last.content and last.role == "user":
        raise RequestError("the last user message is empty", f"messages[{len(history)}].content")
    gen = asked.generation
    n_predict = defaults.max_tokens if gen.max_tokens is None else gen.max_tokens
    request = GenerateRequest(
        prompt=last.content,
        n_predict=None if gen.fit_context else n_predict,
        think=asked.think,
        clear_kv=False,
        sampling=sampling_params(gen.sampling, defaults.sampling),
        constraint=gen.constraint,
        tools=asked.tools,
        role="tool" if last.role == "tool" else "user",
        tool_call_id=last.tool_call_id,
        logprobs=gen.logprobs,
        images=last.images,
        draft=gen.draft,
    )
    return ChatTurn(history=tuple(history), request=request, most=n_predict if gen.fit_context else None)


def completion_request(asked: CompletionRequest, defaults: ServeDefaults) -> GenerateRequest:
    """The session's request for a text completion (raw text, a fresh context)."""
    gen = asked.generation
    return GenerateRequest(
        prompt=asked.prompt,
        n_predict=defaults.max_tokens if gen.max_tokens is None else gen.max_tokens,
        clear_kv=True,
        sampling=sampling_params(gen.sampling, defaults.sampling),
        constraint=gen.constraint,
        logprobs=gen.logprobs,
        draft=gen.draft,
    )


def fill_context(
    request: GenerateRequest, n_prompt: int, n_ctx: int, *, most: int | None = None
) -> GenerateRequest:
    """``request`` with ``n_predict`` set to what the context has left after a prompt of
    ``n_prompt`` tokens (but no more than ``most``), when it sets none (a prompt past the
    context is left for the session to refuse)."""
    if request.n_predict is not None:
        return request
    rest = max(0, n_ctx - n_prompt)
    return attrs.evolve(request, n_predict=rest if most is None else min(most, rest))


def fewest_tokens(texts: Sequence[str], longest_token_bytes: int) -> int:
    """The fewest tokens ``texts`` can tokenize to, when no token stands for more than
    ``longest_token_bytes`` bytes (0: unknown, no bound): a prompt that needs more than the
    context is refused on this figure before it is tokenized."""
    if longest_token_bytes <= 0:
        return 0
    size = sum(len(text.encode("utf-8", errors="replace")) for text in texts)
    return -(-size // longest_token_bytes)


def message_texts(messages: Sequence[ChatMessage]) -> list[str]:
    """What a conversation's messages say: each one's content, reasoning and calls."""
    texts = []
    for m in messages:
        texts += [m.content, m.reasoning, *(c.name + c.arguments for c in m.tool_calls)]
    return texts
