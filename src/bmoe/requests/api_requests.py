"""What a client asks the server for: one frozen value per endpoint, parsed from JSON.

``parse_chat_completion``, ``parse_completion`` and ``parse_decide`` read a request body and
return a value the server can act on, or raise ``RequestError`` naming the field at fault.
OpenAI parameters that bmoe cannot honour (several choices, legacy ``functions``, audio...)
are refused when set to anything but their neutral value, never silently ignored;
parameters that change nothing here (``user``, ``metadata``, ``store``...) are ignored, as
OpenAI-compatible servers do. Tools, response formats, log-probabilities, penalties and
``logit_bias`` are read by ``api_tools``. A user message's ``image_url`` parts
(``{"url": ...}`` or the URL itself, as llama.cpp takes it) are its images, followed as the
``MediaPolicy`` allows (``image_parts``). ``/v1/decide`` is bmoe's own and strict: an unknown
key is refused, so a typo is not ignored.
"""

from __future__ import annotations

import attrs

from bmoe.domain.chat import ChatMessage, Role
from bmoe.domain.decide import DecideRequest
from bmoe.domain.media.images import Image
from bmoe.domain.media.references import INLINE_MEDIA, MediaPolicy
from bmoe.errors import ChoiceError, ConfigError, RequestError
from bmoe.requests.api_tools import (
    chat_logprobs,
    completion_logprobs,
    penalties_and_bias,
    response_constraint,
    tool_calls,
    tool_use,
)
from bmoe.requests.fields import (
    Body,
    opt_bool,
    opt_int,
    opt_number,
    opt_object,
    opt_str,
    refuse_unless,
    stop_strings,
)
from bmoe.requests.image_parts import PartsText, image_list
from bmoe.requests.neutral import ChatRequest, Generation, Sampling

SEED_MAX = 2**32 - 2
"""The highest seed: llama.cpp reads 2**32 - 1 as "pick a random seed"."""


@attrs.frozen(kw_only=True)
class CompletionRequest:
    """``POST /v1/completions``: a raw prompt, fed as text (no chat template)."""

    prompt: str
    generation: Generation = attrs.field(factory=Generation)


ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def parse_chat_completion(body: Body, media: MediaPolicy = INLINE_MEDIA) -> ChatRequest:
    """A ``/v1/chat/completions`` body as a request (``RequestError`` when it is not one);
    ``media`` says which image references its messages may use."""
    refuse_unless(body, "functions", [])
    refuse_unless(body, "function_call", "none")
    refuse_unless(body, "modalities", ["text"])
    refuse_unless(body, "audio")
    refuse_unless(body, "prediction")
    max_tokens = opt_int(body, "max_completion_tokens", low=0)
    if max_tokens is None:
        max_tokens = opt_int(body, "max_tokens", low=0)
    return ChatRequest(
        messages=_messages(body.get("messages"), media),
        think=_think(body),
        generation=_generation(body, max_tokens, chat_logprobs(body)),
        tools=tool_use(body),
    )


def parse_completion(body: Body) -> CompletionRequest:
    """A ``/v1/completions`` body as a request (``RequestError`` when it is not one)."""
    refuse_unless(body, "echo", False)
    refuse_unless(body, "suffix", "")
    refuse_unless(body, "best_of", 1)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError("'prompt' must be a string (or a list of one string)", "prompt")
    if not prompt:
        raise RequestError("'prompt' must not be empty", "prompt")
    generation = _generation(body, opt_int(body, "max_tokens", low=0), completion_logprobs(body))
    return CompletionRequest(prompt=prompt, generation=generation)


DECIDE_KEYS = frozenset({"model", "prefix", "suffix", "choices", "reuse_prefix", "images"})


def parse_decide(body: Body, media: MediaPolicy = INLINE_MEDIA) -> DecideRequest:
    """A ``/v1/decide`` body (the protocol's ``decide`` fields, plus an ignored ``model``,
    and ``images``: the pictures the prompt places with ``<__media__>``, each a data: URI
    or base64, as an ``image_url`` part's ``url``)."""
    unknown = sorted(set(body) - DECIDE_KEYS)
    if unknown:
        raise RequestError(f"unknown field '{unknown[0]}' in a decide request", unknown[0])
    opt_str(body, "model")
    choices = body.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise RequestError("'choices' must be a list of strings", "choices")
    reuse = opt_bool(body, "reuse_prefix")
    prefix = opt_str(body, "prefix") or ""
    suffix = opt_str(body, "suffix") or ""
    images = body.get("images", [])
    if not isinstance(images, list):
        raise RequestError("'images' must be a list of image references (data: URIs or base64)", "images")
    pictures = image_list(images, media)
    try:
        return DecideRequest(
            prefix=prefix,
            suffix=suffix,
            choices=tuple(choices),
            reuse_prefix=True if reuse is None else reuse,
            images=pictures,
        )
    except ConfigError as exc:
        raise RequestError(str(exc), "choices" if isinstance(exc, ChoiceError) else "suffix") from None


def _generation(body: Body, max_tokens: int | None, logprobs: int | None) -> Generation:
    refuse_unless(body, "n", 1)
    options = opt_object(body, "stream_options") or {}
    include_usage = opt_bool(options, "include_usage")
    return Generation(
        model=opt_str(body, "model"),
        max_tokens=max_tokens,
        sampling=Sampling(
            temperature=opt_number(body, "temperature", low=0.0, high=2.0),
            top_p=opt_number(body, "top_p", low=0.0, high=1.0),
            top_k=opt_int(body, "top_k", low=0),
            seed=opt_int(body, "seed", low=0, high=SEED_MAX),
            knobs=penalties_and_bias(body),
        ),
        stop=stop_strings(body),
        stream=bool(opt_bool(body, "stream")),
        include_usage=bool(include_usage),
        constraint=response_constraint(body),
        logprobs=logprobs,
        draft=_drafts(body),
    )


def _drafts(body: Body) -> bool:
    """llama.cpp's ``speculative.n_max``: 0 turns drafting off for the request (any other
    count leaves bmoe's own draft lengths, 8-64 behind long matches)."""
    n_max = opt_int(body, "speculative.n_max", low=0)
    return n_max is None or n_max > 0


def _think(body: Body) -> bool | None:
    kwargs = opt_object(body, "chat_template_kwargs")
    if kwargs is None:
        return None
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
        raise RequestError(
            f"chat_template_kwargs '{unknown[0]}' is not supported (only enable_thinking)",
            "chat_template_kwargs",
            "unsupported_parameter",
        )
    return opt_bool(kwargs, "enable_thinking")


def _messages(value: object, media: MediaPolicy) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list of messages", "messages")
    return tuple(_message(m, f"messages[{i}]", media) for i, m in enumerate(value))


def _message(value: object, where: str, media: MediaPolicy) -> ChatMessage:
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be an object", where)
    role = value.get("role")
    if not isinstance(role, str) or role not in ROLES:
        allowed = ", ".join(ROLES)
        raise RequestError(f"{where}.role must be one of {allowed}, got {role!r}", f"{where}.role")
    if value.get("function_call"):
        raise RequestError(
            f"{where}: function_call is not supported (use tool_calls)",
            f"{where}.function_call",
            "unsupported_parameter",
        )
    calls = tool_calls(value.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else ()
    call_id = (opt_str(value, "tool_call_id") or "") if role == "tool" else ""
    reasoning = value.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise RequestError(f"{where}.reasoning_content must be a string", f"{where}.reasoning_content")
    content, images = _content(value.get("content"), role, f"{where}.content", media)
    return ChatMessage(ROLES[role], content, reasoning or "", calls, call_id, images)


def _content(value: object, role: str, where: str, media: MediaPolicy) -> tuple[str, tuple[Image, ...]]:
    """A string, or a list of text parts (joined by a line break) and, in a user message,
    image parts (a media marker each); ``null`` for an assistant."""
    if isinstance(value, str):
        return value, ()
    if value is None and role == "assistant":
        return "", ()
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a string or a list of text parts", where)
    parts = PartsText(media)
    for i, part in enumerate(value):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict) and kind == "text" and isinstance(part.get("text"), str):
            parts.text(part["text"], at)
        elif isinstance(part, dict) and kind == "image_url" and role == "user":
            reference, ref_at = part.get("image_url"), f"{at}.image_url"
            if isinstance(reference, dict):
                reference, ref_at = reference.get("url"), f"{ref_at}.url"
            parts.image(reference, ref_at, at)
        elif kind == "image_url":
            raise RequestError(
                f"{at}: image parts are taken in user messages only", at, "unsupported_parameter"
            )
        else:
            only = "text and image_url" if role == "user" else "text"
            raise RequestError(f"{at}: only {only} parts are supported", at, "unsupported_parameter")
    return parts.read()
