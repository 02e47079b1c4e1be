"""The server's command line: the front end's shared flags (``bmoe.frontend``), plus its own.

The flags that open the session are spelled, defaulted and read into a ``SessionConfig`` by
the same code as ``python -m bmoe.cli``'s (a test holds the two to the same config for every
flag they share); sampling flags are the defaults for
requests that leave a setting unsaid; the server always renders chat requests through the
model's chat template (there is no ``--chatml``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

from bmoe.errors import ConfigError
from bmoe.frontend import configs
from bmoe.frontend.flags import (
    add_context_options,
    add_decide_options,
    add_model_options,
    add_run_options,
    add_stream_options,
)
from bmoe.requests.mapping import ServeDefaults
from bmoe.runtime import SessionConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.serve",
        description="Serve a Mixture-of-Experts GGUF model over an OpenAI-compatible HTTP API "
        "(docs/server.md).",
        epilog="With no -m, the built-in tiny random-weight model (qwen3moe) is served: its text is "
        "gibberish, but every endpoint works.",
    )
    add_model_options(p)
    p.add_argument("--alias", help="the model id the API reports (default: the file name without .gguf)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument(
        "--port", type=int, default=8080, help="port to listen on; 0 picks a free one (default: 8080)"
    )
    p.add_argument(
        "-n",
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="max_tokens of a request that sets none (default: until the context is full)",
    )
    add_context_options(p)
    p.add_argument(
        "-np",
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="serve N requests at once as parallel sequences of one context, continuously batched "
        "(llama.cpp's -np; each request's default max_tokens fills n_ctx / N; default: 1)",
    )
    add_run_options(p, server=True)
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: info: one access line per request)",
    )
    h = p.add_argument_group("HTTP: keys, limits, service endpoints")
    h.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a key every request but /health must present (Authorization: Bearer KEY or x-api-key: KEY); "
        "repeatable (llama.cpp's flag)",
    )
    h.add_argument(
        "--api-key-file", type=Path, metavar="FILE", help="read keys from FILE, one a line (llama.cpp's flag)"
    )
    h.add_argument(
        "--max-body-mb",
        type=float,
        default=None,
        metavar="MB",
        help="largest request body, in MiB; a larger one is answered 413 unread "
        "(default: 32 bytes per context token, at least 8)",
    )
    h.add_argument(
        "--media-path",
        type=Path,
        metavar="DIR",
        help="read file:// image URLs in requests from DIR and the folders in it (llama.cpp's flag; "
        "default: file:// images refused)",
    )
    h.add_argument(
        "--allow-remote-media",
        action="store_true",
        help="fetch http(s):// image URLs in requests (each at most the body limit, in 10 s; "
        "default: refused), from public addresses only: a host that resolves to a loopback, "
        "private, link-local, multicast or reserved address, or a redirect to one, is refused",
    )
    h.add_argument(
        "--allow-private-media",
        action="store_true",
        help="with --allow-remote-media: fetch from loopback, private and link-local addresses "
        "too (an image server on this machine or its network; default: refused)",
    )
    h.add_argument(
        "--metrics", action="store_true", help="serve GET /metrics (Prometheus text format, as llama.cpp's)"
    )
    add_stream_options(p)
    d = p.add_argument_group("decisions (docs/decide.md)")
    add_decide_options(d, "accept POST /v1/decide")
    return p


@attrs.frozen
class HttpOptions:
    """The HTTP side's settings: the API keys (none: no key needed), the largest body
    (``None``: derived from the context), whether ``/metrics`` is served, and where a
    request's images may come from besides the request: ``media_path`` (resolved) for
    ``file://`` URLs, ``allow_remote_media`` for ``http(s)://`` ones (from private addresses
    too with ``allow_private_media``)."""

    api_keys: tuple[str, ...] = ()
    max_body_mb: float | None = None
    metrics: bool = False
    media_path: Path | None = None
    allow_remote_media: bool = False
    allow_private_media: bool = False


def read_api_keys(path: Path) -> list[str]:
    """The keys of an ``--api-key-file``: one a line, blank lines and ``#`` comments skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read --api-key-file {path}: {exc.strerror or exc}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def http_options(args: argparse.Namespace) -> HttpOptions:
    """What the parsed flags say of the HTTP side (``ConfigError``: a key file unread,
    a limit not positive, a media path that is not a folder)."""
    keys = [k.strip() for k in args.api_key]
    if any(not k for k in keys):
        raise ConfigError("--api-key must not be empty")
    if args.api_key_file is not None:
        keys += read_api_keys(args.api_key_file)
        if not keys:
            raise ConfigError(f"--api-key-file {args.api_key_file} holds no key")
    if args.max_body_mb is not None and not args.max_body_mb > 0:
        raise ConfigError("--max-body-mb must be > 0")
    if args.allow_private_media and not args.allow_remote_media:
        raise ConfigError("--allow-private-media needs --allow-remote-media (it widens what is fetched)")
    return HttpOptions(
        api_keys=tuple(keys),
        max_body_mb=args.max_body_mb,
        metrics=args.metrics,
        media_path=None if args.media_path is None else media_folder(args.media_path),
        allow_remote_media=args.allow_remote_media,
        allow_private_media=args.allow_private_media,
    )


def media_folder(path: Path) -> Path:
    """``--media-path``, resolved (``ConfigError`` when it is not a folder)."""
    try:
        folder = path.expanduser().resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"--media-path {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not folder.is_dir():
        raise ConfigError(f"--media-path {path} is not a folder")
    return folder


def session_config(args: argparse.Namespace, model_path: Path) -> SessionConfig:
    """The session the server opens: the shared flags' (``bmoe.frontend``), in chat mode,
    with ``-np`` parallel sequences."""
    config = configs.session_config(args, model_path)
    return attrs.evolve(config, chat=True, context=attrs.evolve(config.context, n_seq_max=args.parallel))


def serve_defaults(args: argparse.Namespace) -> ServeDefaults:
    """What requests that leave a setting unsaid get."""
    return ServeDefaults(
        sampling=configs.sampling_params(args),
        max_tokens=args.max_tokens,
    )


def model_id(args: argparse.Namespace, model_path: Path) -> str:
    """The id ``/v1/models`` lists: ``--alias``, else the file name less ``.gguf``."""
    if args.alias:
        return str(args.alias)
    return model_path.name.removesuffix(".gguf")
