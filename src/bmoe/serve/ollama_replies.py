"""Ollama's API answers: ``/api/chat`` and ``/api/generate`` objects (whole, or streamed one
JSON object a line), from the neutral ``Delta`` pieces and ``Outcome``; and the model's
listing (``/api/tags``, ``/api/show``, ``/api/ps``) from its ``ModelFacts``.

``OllamaWriter`` follows one reply: each ``delta()`` is an object with ``done: false`` (chat:
``message.content`` and ``message.thinking``; generate: ``response`` and ``thinking``);
``finish()`` gives the calls the reply made (chat: an object whose ``message.tool_calls``
holds them, each ``function`` with its ``arguments`` as an object) and the last object:
``done: true``, ``done_reason`` (``stop``, or ``length`` where the reply was cut),
``prompt_eval_count`` (the prompt's tokens), ``eval_count`` (those generated) and the
durations in nanoseconds (``total_duration`` since the request came, ``load_duration`` 0:
the model was loaded when the server started, ``prompt_eval_duration`` the prefill,
``eval_duration`` the decode). A whole answer is the same writer fed the outcome as one
piece. ``created_at`` is when each object is written (UTC, RFC 3339).
"""

from __future__ import annotations

import datetime
import math
import time
from typing import Any

import attrs

from bmoe.domain.generation import TokenChoice, TokenLogprob
from bmoe.domain.tools import ToolCall
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.ollama_requests import Probe

Json = dict[str, Any]
NS = 1_000_000_000
VERSION = "0.12.0"
"""The Ollama release whose API bmoe's answers follow (``GET /api/version``)."""
FOREVER = "2999-01-01T00:00:00Z"  # a model loaded for the server's life: when it "expires"


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def tool_call(call: ToolCall, index: int) -> Json:
    """A call in Ollama's shape: its ``arguments`` an object (``{}`` for a call cut short)."""
    arguments = call.arguments_object()
    return {
        "id": call.id,
        "function": {
            "index": index,
            "name": call.name,
            "arguments": arguments if isinstance(arguments, dict) else {},
        },
    }


def _token(choice: TokenChoice) -> Json:
    logprob = choice.logprob if math.isfinite(choice.logprob) else -9999.0
    return {"token": choice.piece, "logprob": logprob, "bytes": list(choice.text)}


def logprobs_body(logprobs: tuple[TokenLogprob, ...]) -> list[Json]:
    """Ollama's ``logprobs``: each token, its log-probability and its ``top_logprobs``."""
    return [{**_token(lp.chosen), "top_logprobs": [_token(t) for t in lp.top]} for lp in logprobs]


class OllamaWriter:
    """The objects of one ``/api/chat`` (``chat``) or ``/api/generate`` reply (see the
    module's docstring); ``started_ns``: when the request came (``time.perf_counter_ns``)."""

    def __init__(self, model: str, *, chat: bool, started_ns: int, logprobs: bool = False) -> None:
        self.model = model
        self.chat = chat
        self.started_ns = started_ns
        self.logprobs = logprobs

    def _object(self, text: str, reasoning: str, *, done: bool) -> Json:
        body: Json = {"model": self.model, "created_at": now_rfc3339()}
        if self.chat:
            message: Json = {"role": "assistant", "content": text}
            if reasoning:
                message["thinking"] = reasoning
            body["message"] = message
        else:
            body["response"] = text
            if reasoning:
                body["thinking"] = reasoning
        body["done"] = done
        return body

    def delta(self, d: Delta) -> list[Json]:
        """The object a streamed piece adds (none for an empty one, or for calls: they come
        whole with ``finish``)."""
        if not (d.text or d.reasoning or d.logprobs):
            return []
        body = self._object(d.text, d.reasoning, done=False)
        if self.logprobs and d.logprobs:
            body["logprobs"] = logprobs_body(d.logprobs)
        return [body]

    def finish(self, o: Outcome) -> list[Json]:
        """The reply's calls (chat) and its last object."""
        out: list[Json] = []
        if self.chat and o.tool_calls:
            calls = self._object("", "", done=False)
            calls["message"]["tool_calls"] = [tool_call(c, i) for i, c in enumerate(o.tool_calls)]
            out.append(calls)
        return [*out, self.last(o)]

    def last(self, o: Outcome, text: str = "", reasoning: str = "") -> Json:
        """The ``done`` object: why it ended, the counts and the durations."""
        body = self._object(text, reasoning, done=True)
        body.update(
            done_reason="length" if o.finish_reason == "length" else "stop",
            total_duration=max(0, time.perf_counter_ns() - self.started_ns),
            load_duration=0,
            prompt_eval_count=o.prompt_tokens,
            prompt_eval_duration=round(o.prefill_s * NS),
            eval_count=o.completion_tokens,
            eval_duration=round(o.decode_s * NS),
        )
        return body

    def whole(self, o: Outcome) -> Json:
        """The reply not streamed: one object, ``done`` and all."""
        calls_only = bool(o.tool_calls) and not o.text.strip()
        body = self.last(o, "" if calls_only else o.text, o.reasoning)
        if self.chat and o.tool_calls:
            body["message"]["tool_calls"] = [tool_call(c, i) for i, c in enumerate(o.tool_calls)]
        if self.logprobs and o.logprobs is not None:
            body["logprobs"] = logprobs_body(o.logprobs)
        return body

    def probe(self, probe: Probe) -> Json:
        """The answer to a request with nothing to generate: the model is loaded (it stays
        so: ``unload`` is answered and nothing is unloaded)."""
        body = self._object("", "", done=True)
        body["done_reason"] = probe
        return body


@attrs.frozen(kw_only=True)
class ModelFacts:
    """The served model as Ollama's listings describe it: its ``name`` (``name:tag``), the
    file's ``size`` in bytes and when it was ``modified_at``, a ``digest`` (of the file's
    name, size and time: an identity, not a hash of its bytes), its architecture
    (``family``), ``parameter_count``, quantization, context length (the server's), chat
    template and ``capabilities`` (``completion``, ``tools``, ``vision``, ``thinking``)."""

    name: str
    size: int
    modified_at: str
    digest: str
    family: str
    parameter_count: int
    quantization_level: str
    context_length: int
    template: str
    capabilities: tuple[str, ...]

    @property
    def parameter_size(self) -> str:
        """``30.5B``, ``494.03M``, as Ollama writes it."""
        n = self.parameter_count
        return f"{n / 1e9:.1f}B" if n >= 1_000_000_000 else f"{n / 1e6:.2f}M"

    def details(self) -> Json:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization_level,
        }

    def tags_body(self) -> Json:
        """``GET /api/tags``: the one model served."""
        model = {
            "name": self.name,
            "model": self.name,
            "modified_at": self.modified_at,
            "size": self.size,
            "digest": self.digest,
            "details": self.details(),
        }
        return {"models": [model]}

    def show_body(self) -> Json:
        """``POST /api/show``."""
        return {
            "modelfile": f"# served by bmoe\nFROM {self.name}\n",
            "parameters": "",
            "template": self.template,
            "details": self.details(),
            "model_info": {
                "general.architecture": self.family,
                "general.parameter_count": self.parameter_count,
                f"{self.family}.context_length": self.context_length,
            },
            "capabilities": list(self.capabilities),
            "modified_at": self.modified_at,
        }

    def ps_body(self) -> Json:
        """``GET /api/ps``: the model, loaded for the server's life."""
        model = {
            "name": self.name,
            "model": self.name,
            "size": self.size,
            "digest": self.digest,
            "details": self.details(),
            "expires_at": FOREVER,
            "size_vram": 0,
            "context_length": self.context_length,
        }
        return {"models": [model]}


def version_body() -> Json:
    """``GET /api/version``."""
    return {"version": VERSION}


def not_found(model: str) -> str:
    """Ollama's message for a model it does not have (with a 404)."""
    return f"model '{model}' not found"
