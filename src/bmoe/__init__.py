"""bmoe: run Mixture-of-Experts GGUF models larger than RAM on llama.cpp.

What an app needs, in one namespace (docs/library.md)::

    import bmoe

    config = bmoe.SessionConfig(model_path=bmoe.default_model_path(), chat=True,
                                stream=bmoe.StreamConfig(enabled=True, cache_mb=4000))
    with bmoe.Session.open(config) as s:
        for piece in s.stream(bmoe.GenerateRequest("Hello!")):
            print(piece.text, end="")

- ``Session`` / ``SessionConfig`` (``SessionConfig.from_hf`` for a Hub model): load once,
  then ``generate``, ``stream`` / ``astream`` (pieces as they are generated; leaving the
  loop cancels), ``chat`` / ``chat_stream`` (OpenAI-shaped messages and chat-completions
  fields, read as the server reads them), ``decide``; ``run`` for one request;
- the values they take and give: ``GenerateRequest``, ``SamplingParams``, ``ContextParams``,
  ``StreamConfig``, ``DecideConfig``, ``DecideRequest``, ``ChatMessage``, ``RunResult``,
  ``Progress``, ``Piece``, ``Outcome`` and ``Delta`` (a chat's reply and its streamed
  pieces), ``DecideResult``;
- ``Llama``: llama-cpp-python's ``Llama`` API (``create_completion``,
  ``create_chat_completion``, ``stream=True``) over a session;
- ``default_model_path()``: the built-in tiny model (random weights, gibberish text);
- the errors: ``BmoeError`` and its subclasses (``bmoe.errors``).

The errors load with ``import bmoe``; everything else on first use, so importing bmoe costs
no llama.cpp load (``__init__.pyi`` tells type checkers what each name is). The layer map is
docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from bmoe.errors import (
    BmoeError,
    ChoiceCollisionError,
    ChoiceError,
    ConfigError,
    ContextInitError,
    ContextOverflowError,
    DecideDisabledError,
    DecideOverflowError,
    DecideRefusedError,
    DecodeAbortedError,
    DecodeError,
    ExpertGraphError,
    ExpertReadError,
    FixtureError,
    GrammarError,
    KvCacheFullError,
    ModelFetchError,
    ModelFileTruncatedError,
    ModelLoadError,
    RequestError,
    SessionFailedError,
    StreamingFaultError,
    StreamingSetupError,
    TokenizeError,
    ToolFormatError,
)

__version__ = "0.1.0"

_LAZY = {
    "ContextParams": "bmoe.adapters.llama.context",
    "ChatMessage": "bmoe.domain.chat",
    "DecideConfig": "bmoe.domain.decide",
    "DecideRequest": "bmoe.domain.decide",
    "DecideResult": "bmoe.domain.decide",
    "GenerateRequest": "bmoe.domain.generation",
    "Progress": "bmoe.domain.generation",
    "RunResult": "bmoe.domain.generation",
    "Piece": "bmoe.domain.pieces",
    "SamplingParams": "bmoe.domain.sampling",
    "Delta": "bmoe.requests.neutral",
    "Outcome": "bmoe.requests.neutral",
    "StreamConfig": "bmoe.domain.streaming",
    "Llama": "bmoe.llama_compat",
    "Session": "bmoe.runtime",
    "SessionConfig": "bmoe.runtime",
    "run": "bmoe.runtime",
    "default_model_path": "bmoe.tinymodel",
}
"""Each name ``import bmoe`` offers but loads on first use, and the module holding it."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bmoe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "BmoeError",
    "ChatMessage",
    "ChoiceCollisionError",
    "ChoiceError",
    "ConfigError",
    "ContextInitError",
    "ContextOverflowError",
    "ContextParams",
    "DecideConfig",
    "DecideDisabledError",
    "DecideOverflowError",
    "DecideRefusedError",
    "DecideRequest",
    "DecideResult",
    "DecodeAbortedError",
    "DecodeError",
    "Delta",
    "ExpertGraphError",
    "ExpertReadError",
    "FixtureError",
    "GenerateRequest",
    "GrammarError",
    "KvCacheFullError",
    "Llama",
    "ModelFetchError",
    "ModelFileTruncatedError",
    "ModelLoadError",
    "Outcome",
    "Piece",
    "Progress",
    "RequestError",
    "RunResult",
    "SamplingParams",
    "Session",
    "SessionConfig",
    "SessionFailedError",
    "StreamConfig",
    "StreamingFaultError",
    "StreamingSetupError",
    "TokenizeError",
    "ToolFormatError",
    "__version__",
    "default_model_path",
    "run",
]
