"""Ollama's API (``POST /api/chat``, ``POST /api/generate``): a body read into the neutral
``ChatRequest`` (or, for ``generate`` with ``raw``, a ``CompletionRequest``).

``messages``: ``system``, ``user``, ``assistant`` and ``tool`` messages; ``content`` a string
(absent: empty); a user's or a tool's ``images`` (base64 strings, each placed before the
text, as Ollama places them); an assistant's ``tool_calls`` (``function.name`` and
``function.arguments``, an object) and ``thinking`` (kept as its reasoning); a tool's result
answers the call of its ``tool_name`` (or ``tool_call_id``) among the calls before it, else
the first one unanswered. ``generate``'s ``prompt`` (with ``system`` and ``images``) is one
user message, rendered by the chat template unless ``raw`` (then it is fed as text).

``tools`` as Ollama (and OpenAI) write them; ``format``: ``"json"`` (any JSON object) or a
JSON schema, enforced as ``response_format`` is; ``think``: ``true``, ``false`` or an effort
(``"high"``, ``"medium"``, ``"low"``: thinking on); ``logprobs`` with ``top_logprobs``.
``options`` (``OPTIONS``): ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed`` (a
negative one: the server's), ``num_predict`` (-1 or -2: until the context is full; a most,
cut to what the prompt leaves of the context, as Ollama never refuses it), ``stop``,
``repeat_penalty``, ``repeat_last_n`` (64 unless said, Ollama's default; -1 the whole
context), ``frequency_penalty``, ``presence_penalty``; ``num_ctx`` is read and changes
nothing (the context is set when the server starts); the load-time and the other sampling
options (``IGNORED_OPTIONS``) are accepted and ignored, as Ollama ignores options it does not
know. ``keep_alive`` is accepted (the model stays loaded while the server runs). A request
with no messages (no prompt) only asks the model to load (``keep_alive`` 0: to unload), and
is answered so at once. ``template``, ``suffix`` and ``context`` are refused by name.
Every failure is a ``RequestError`` naming the field.
"""

from __future__ import annotations

import json
import math
from typing import Literal

import attrs

from bmoe.domain.chat import ChatMessage, Role
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.media.images import Image
from bmoe.domain.media.references import INLINE_MEDIA, MediaPolicy
from bmoe.domain.tools import ToolCall, ToolUse
from bmoe.errors import RequestError
from bmoe.requests.api_requests import SEED_MAX, CompletionRequest
from bmoe.requests.api_tools import tool_use
from bmoe.requests.fields import Body, opt_bool, opt_int, opt_number, opt_object, opt_str, stop_strings
from bmoe.requests.image_parts import PartsText
from bmoe.requests.neutral import ChatRequest, Generation, Sampling

Probe = Literal["load", "unload"]
ROLES: dict[str, Role] = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
OPTIONS = frozenset(
    {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "seed",
        "num_predict",
        "num_ctx",
        "stop",
        "repeat_penalty",
        "repeat_last_n",
        "frequency_penalty",
        "presence_penalty",
    }
)
IGNORED_OPTIONS = frozenset(
    {
        "numa",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "embedding_only",
        "num_thread",
        "num_keep",
        "tfs_z",
        "typical_p",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "penalize_newline",
    }
)
REPEAT_LAST_N = 64  # Ollama's default window for its penalties
STOP_MAX = 16
TOP_LOGPROBS_MAX = 20


@attrs.frozen(kw_only=True)
class OllamaRequest:
    """A ``/api/chat`` or ``/api/generate`` body: the ``model`` it named (the reply echoes
    it), whether to ``stream``, and either the chat turn (``chat``), a raw completion
    (``raw``) or a ``probe`` (no messages: load, or with ``keep_alive`` 0 unload)."""

    model: str
    stream: bool
    chat: ChatRequest | None = None
    raw: CompletionRequest | None = None
    probe: Probe | None = None


def parse_chat(body: Body, media: MediaPolicy = INLINE_MEDIA) -> OllamaRequest:
    """A ``/api/chat`` body (``RequestError`` when it is not one); ``media`` says how its
    images may be read (base64 only, as Ollama takes them)."""
    model, stream = _model(body), _stream(body)
    messages = body.get("messages")
    if messages is None or messages == []:
        _options(body)  # still checked
        return OllamaRequest(model=model, stream=stream, probe=_probe(body))
    generation = _generation(body, model, stream)
    chat = ChatRequest(
        messages=_messages(messages, media),
        think=_think(body),
        generation=generation,
        tools=_tools(body),
    )
    return OllamaRequest(model=model, stream=stream, chat=chat)


def parse_generate(body: Body, media: MediaPolicy = INLINE_MEDIA) -> OllamaRequest:
    """A ``/api/generate`` body (``RequestError`` when it is not one)."""
    for name in ("template", "suffix"):
        if opt_str(body, name):
            raise RequestError(f"'{name}' is not supported by this server", name, "unsupported_parameter")
    if body.get("context"):
        raise RequestError(
            "'context' (the tokens of an earlier reply) is not supported: send the conversation to /api/chat",
            "context",
            "unsupported_parameter",
        )
    model, stream = _model(body), _stream(body)
    prompt = opt_str(body, "prompt") or ""
    images = body.get("images")
    if images is not None and not isinstance(images, list):
        raise RequestError("'images' must be a list of base64 strings", "images")
    if not prompt and not images:
        _options(body)
        return OllamaRequest(model=model, stream=stream, probe=_probe(body))
    generation = _generation(body, model, stream)
    if opt_bool(body, "raw"):
        if images:
            raise RequestError("'images' need the chat template: not with 'raw'", "images")
        return OllamaRequest(
            model=model, stream=stream, raw=CompletionRequest(prompt=prompt, generation=generation)
        )
    text, pictures = _content(prompt, images, "prompt", "images", media)
    system = opt_str(body, "system")
    messages = (
        *([ChatMessage("system", system)] if system else []),
        ChatMessage("user", text, images=pictures),
    )
    chat = ChatRequest(messages=messages, think=_think(body), generation=generation)
    return OllamaRequest(model=model, stream=stream, chat=chat)


def same_model(asked: str, served: str) -> bool:
    """Whether ``asked`` names the served model: its id, with or without a ``:tag`` of
    ``latest`` (Ollama's names carry a tag; a name without one means ``:latest``), letter
    case aside."""
    return _tagged(asked) == _tagged(served)


def tagged_name(served: str) -> str:
    """The served model's name as Ollama lists it (``name:tag``)."""
    return served if ":" in served else f"{served}:latest"


def _tagged(name: str) -> str:
    return tagged_name(name.strip()).lower()


def _model(body: Body) -> str:
    model = opt_str(body, "model")
    if not model:
        raise RequestError("'model' is required", "model")
    return model


def _stream(body: Body) -> bool:
    stream = opt_bool(body, "stream")
    return True if stream is None else stream


def _probe(body: Body) -> Probe:
    keep = body.get("keep_alive")
    _keep_alive(keep)
    return "unload" if keep in (0, "0", "0s", "0m", "0h") else "load"


def _keep_alive(value: object) -> None:
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise RequestError("'keep_alive' must be a duration ('5m') or a number of seconds", "keep_alive")


def _generation(body: Body, model: str, stream: bool) -> Generation:
    _keep_alive(body.get("keep_alive"))
    sampling, most, stop = _options(body)
    return Generation(
        model=model,
        max_tokens=most,
        sampling=sampling,
        stop=stop,
        stream=stream,
        constraint=_format(body.get("format")),
        logprobs=_logprobs(body),
        fit_context=True,
    )


def _options(body: Body) -> tuple[Sampling, int | None, tuple[str, ...]]:
    """``options`` as the sampling, the most tokens to generate and the stop strings."""
    options = opt_object(body, "options") or {}
    known = {name: value for name, value in options.items() if name in OPTIONS}
    where = {name: f"options.{name}" for name in known}
    try:
        predict = opt_int(known, "num_predict", low=-2)
        opt_int(known, "num_ctx", low=1)
        seed = opt_int(known, "seed", high=SEED_MAX)
        knobs: dict[str, object] = {}
        min_p = opt_number(known, "min_p", low=0.0, high=1.0)
        if min_p:
            knobs["min_p"] = min_p
        repeat = opt_number(known, "repeat_penalty", low=0.0, high=math.inf)
        if repeat is not None:
            if repeat <= 0.0:
                raise RequestError("'repeat_penalty' must be > 0", "repeat_penalty")
            if repeat != 1.0:
                knobs["repeat_penalty"] = repeat
        for name in ("frequency_penalty", "presence_penalty"):
            value = opt_number(known, name, low=-math.inf, high=math.inf)
            if value:
                knobs[name] = value
        last_n = opt_int(known, "repeat_last_n", low=-1)
        if knobs.keys() - {"min_p"}:
            knobs["penalty_last_n"] = REPEAT_LAST_N if last_n is None else last_n
        sampling = Sampling(
            temperature=opt_number(known, "temperature", low=0.0, high=math.inf),
            top_p=opt_number(known, "top_p", low=0.0, high=1.0),
            top_k=opt_int(known, "top_k", low=0),
            seed=None if seed is None or seed < 0 else seed,
            knobs=knobs,
        )
        stop = stop_strings(known, "stop", most=STOP_MAX)
    except RequestError as exc:
        name = exc.param or ""
        raise RequestError(
            str(exc).replace(f"'{name}'", f"'options.{name}'"), where.get(name, name)
        ) from None
    return sampling, None if predict is None or predict < 0 else predict, stop


def _format(value: object) -> OutputConstraint | None:
    if value is None or value == "":
        return None
    if value == "json":
        return OutputConstraint("json_object")
    if isinstance(value, dict):
        return OutputConstraint.json_schema(value)
    raise RequestError("'format' must be \"json\" or a JSON schema object", "format")


def _think(body: Body) -> bool | None:
    value = body.get("think")
    if value is None or isinstance(value, bool):
        return value
    if value in ("high", "medium", "low"):
        return True
    raise RequestError("'think' must be true, false, 'high', 'medium' or 'low'", "think")


def _logprobs(body: Body) -> int | None:
    if not opt_bool(body, "logprobs"):
        return None
    return opt_int(body, "top_logprobs", low=0, high=TOP_LOGPROBS_MAX) or 0


def _tools(body: Body) -> ToolUse | None:
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    return tool_use({"tools": tools})


def _messages(value: object, media: MediaPolicy) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list):
        raise RequestError("'messages' must be a list of messages", "messages")
    out: list[ChatMessage] = []
    unanswered: list[ToolCall] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object", where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RequestError(
                f"{where}.role must be 'system', 'user', 'assistant' or 'tool', got {role!r}", f"{where}.role"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string", f"{where}.content")
        images = message.get("images")
        if images and role not in ("user", "tool"):
            raise RequestError(
                f"{where}.images: only a user's or a tool's message holds images", f"{where}.images"
            )
        text, pictures = _content(content or "", images, f"{where}.content", f"{where}.images", media)
        if role == "assistant":
            thinking = opt_str(message, "thinking") or ""
            calls = _calls(message.get("tool_calls"), i, f"{where}.tool_calls")
            unanswered = list(calls)
            out.append(ChatMessage("assistant", text, thinking, calls))
        elif role == "tool":
            call_id = _answered(message, unanswered, where)
            out.append(ChatMessage("tool", text, tool_call_id=call_id, images=pictures))
        else:
            out.append(ChatMessage(ROLES[role], text, images=pictures))
    if not out:
        raise RequestError("'messages' must not be empty", "messages")
    return tuple(out)


def _content(
    text: str, images: object, where: str, images_at: str, media: MediaPolicy
) -> tuple[str, tuple[Image, ...]]:
    """A message's text with its images (base64 strings) placed before it."""
    if not images:
        return text, ()
    if not isinstance(images, list):
        raise RequestError(f"{images_at} must be a list of base64 strings", images_at)
    parts = PartsText(media)
    for j, data in enumerate(images):
        parts.base64_image(data, f"{images_at}[{j}]", f"{images_at}[{j}]")
    if text:
        parts.text(text, where)
    return parts.read()


def _calls(value: object, index: int, where: str) -> tuple[ToolCall, ...]:
    """An assistant's ``tool_calls`` (ids made up where Ollama gives none: ``call_<i>_<j>``)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a list of calls", where)
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise RequestError(f"{at}.function must be an object", f"{at}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"{at}.function.name must be a string", f"{at}.function.name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):  # some clients send the JSON text
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                raise RequestError(
                    f"{at}.function.arguments must be an object", f"{at}.function.arguments"
                ) from None
        if not isinstance(arguments, dict):
            raise RequestError(f"{at}.function.arguments must be an object", f"{at}.function.arguments")
        given = call.get("id")
        call_id = given if isinstance(given, str) and given else f"call_{index}_{j}"
        calls.append(ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False)))
    return tuple(calls)


def _answered(message: Body, unanswered: list[ToolCall], where: str) -> str:
    """The id of the call a tool message answers: by ``tool_call_id``, by ``tool_name``, else
    the first unanswered one ('' when there is none)."""
    call_id = opt_str(message, "tool_call_id")
    name = opt_str(message, "tool_name") or opt_str(message, "name")
    for i, call in enumerate(unanswered):
        if call_id == call.id or (call_id is None and (name is None or name == call.name)):
            return unanswered.pop(i).id
    return call_id or ""
