"""Every error bmoe raises on purpose derives from ``BmoeError``.

Where an error resembles a builtin, it also derives from that builtin, so callers that
already catch ``ValueError`` or ``OSError`` keep working. llama.cpp's return codes become
these types in one place: ``bmoe.adapters.llama.status``.
"""

from __future__ import annotations

from typing import TypeGuard


class BmoeError(Exception):
    """Base of every error bmoe raises on purpose."""


class ConfigError(BmoeError, ValueError):
    """A setting or request that cannot be honoured (caught before any work is done).
    ``where``: the request field at fault, when the error knows it (the server's ``param``)."""

    def __init__(self, message: str = "", where: str | None = None) -> None:
        super().__init__(message)
        self.where = where


class RequestError(ConfigError):
    """A request read from OpenAI's JSON shapes that cannot be acted on, the client's fault
    (the server's HTTP 400; ``Session.chat`` raises it as the server answers it).

    ``param`` (also ``where``): the request field at fault (``messages[1].content``),
    ``None`` when the whole request is; ``code``: OpenAI's machine-readable reason, when
    there is one (``unsupported_parameter``).
    """

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, param)
        self.param = param
        self.code = code


class ContextOverflowError(ConfigError):
    """A prompt (plus the tokens to generate) does not fit in the context fixed at open."""


class GrammarError(ConfigError):
    """A reply's constraint that cannot become a grammar: a JSON schema construct the
    engine cannot enforce, or GBNF that llama.cpp does not parse. ``where``: the request
    field at fault and, for a schema keyword, its JSON pointer
    (``response_format.json_schema.schema#/properties/tags/uniqueItems``), or ``None``."""


class ToolFormatError(ConfigError):
    """Tools asked of a model whose chat template writes calls in a syntax bmoe does not read."""


class ModelFetchError(BmoeError, OSError):
    """A ``-hf`` model could not be had: no such repository, not cached while offline, a
    download that failed."""


class FileNotKeptError(BmoeError, OSError):
    """A file bmoe writes could not be kept for the disk's sake (no space, a read-only
    folder, a permission, an I/O error, the folder gone): its temporary file is removed and
    nothing stands under its name (``bmoe.adapters.file_writes``). ``folder``: where;
    ``what``: what was not kept; ``errno``: the system's error; ``reason``: it in words
    (``No space left on device (ENOSPC)``). Where the file is only a
    cache (a prompt state, a usage profile) it is a warning, never a request's error."""

    def __init__(self, message: str, *, folder: str, what: str, errno: int | None, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message
        self.folder = folder
        self.what = what
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0])


class ModelLoadError(BmoeError, OSError):
    """llama.cpp could not load the model file (missing, unreadable, unsupported)."""


class ContextInitError(BmoeError, RuntimeError):
    """llama.cpp could not create a context (usually: not enough memory for the KV cache)."""


class TokenizeError(ConfigError):
    """Text could not be turned into tokens (text that is not valid Unicode, such as a lone
    surrogate from a JSON ``"\\ud800"``): the request is refused, the session goes on."""


class ImageError(ConfigError):
    """An image a request carries that cannot be used: the model has no vision encoder, the
    picture does not decode, or it does not fit. ``where`` names the image's place."""


class VisionEncoderError(BmoeError, OSError):
    """The vision encoder (``--mmproj``) did not load: not an mmproj, a projector llama.cpp
    does not know, or one made for another model."""


class DecodeError(BmoeError, RuntimeError):
    """``llama_decode`` failed; ``code`` is its return value."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class KvCacheFullError(DecodeError):
    """``llama_decode`` found no KV slot for the batch (return code 1)."""


class DecodeAbortedError(DecodeError):
    """The abort callback stopped ``llama_decode`` (return code 2): a cancel or a failed read."""


class FixtureError(BmoeError, ValueError):
    """An unknown tiny-model fixture was asked for, or it could not be built."""


class SessionFailedError(BmoeError, RuntimeError):
    """A fatal error ended the session earlier (sticky); open a new one."""


class DecideRefusedError(ConfigError):
    """A decision refused before anything was prefilled: the session and the kept prefix
    state are exactly as they were, and the next request is served."""


class DecideDisabledError(DecideRefusedError):
    """A decision asked of a session opened without decisions (``--decide``)."""


class ChoiceError(DecideRefusedError):
    """The choice list cannot be scored: empty, an empty choice, or one that tokenizes to
    nothing."""


class ChoiceCollisionError(ChoiceError):
    """Two choices start with the same token, so their first-token scores would tie.

    ``first`` and ``second`` are the indices of the two choices, ``token`` the shared id.
    """

    def __init__(self, message: str, first: int, second: int, token: int) -> None:
        super().__init__(message)
        self.first = first
        self.second = second
        self.token = token


class DecideOverflowError(DecideRefusedError, ContextOverflowError):
    """A decision's rendered prompt is longer than the context."""


class ModelFileTruncatedError(BmoeError, OSError):
    """A resident session's model file was truncated in place: its mapped weights are gone.
    Fatal for the session."""


class StreamingSetupError(BmoeError, OSError):
    """Expert streaming could not be set up (a model file that cannot be opened, memory
    that cannot be mapped or allocated): the session does not open."""


class ExpertStoreError(ConfigError):
    """An expert store that cannot be written (no room) or, named with ``--expert-store
    PATH``, cannot serve this model here (another model, another llama.cpp, cut)."""


class StreamingFaultError(BmoeError):
    """Expert streaming stopped for good: any output computed from now on would use experts
    that were never read. Fatal for the session (``SessionFailedError`` afterwards)."""


class ExpertReadError(StreamingFaultError, OSError):
    """Streaming could not read an expert (I/O error, short read, a model file truncated or
    replaced under the session)."""


class ExpertGraphError(StreamingFaultError, RuntimeError):
    """The compute graph routed to something streaming cannot serve (a layer without known
    experts, an expert id out of range)."""


def is_fatal(error: BaseException) -> TypeGuard[BmoeError]:
    """Whether ``error`` leaves the engine broken, so that the session must end (sticky):
    the one place that decides it, by the error's type (docs/reliability.md, "Fatal or
    not"). Fatal: a streaming fault (an expert read failed, a graph streaming cannot
    serve), a resident model file truncated, a decode that failed inside llama.cpp
    (``DecodeError``, ``KvCacheFullError``; not ``DecodeAbortedError``, a cancel). Everything
    else, whatever a request brought (its constraint dead-ending, a context overflow, a
    tokenization, a tool call that does not parse, an error of Python's), ends that request
    only."""
    if isinstance(error, DecodeAbortedError):
        return False
    return isinstance(error, StreamingFaultError | ModelFileTruncatedError | DecodeError | SessionFailedError)
