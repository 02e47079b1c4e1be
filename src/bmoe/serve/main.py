"""``python -m bmoe.serve``: open the session, then serve HTTP until interrupted."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bmoe.errors import BmoeError
from bmoe.frontend.configs import resolve_model
from bmoe.frontend.devices import list_devices
from bmoe.frontend.stopping import Stopping
from bmoe.runtime import Session
from bmoe.serve.api_responses import ModelCard
from bmoe.serve.flags import HttpOptions, build_parser, http_options, model_id, serve_defaults, session_config
from bmoe.serve.service import ServedSession

if TYPE_CHECKING:
    from bmoe.serve.http_server import HttpServer


def model_card(session: Session, name: str) -> ModelCard:
    """What ``/v1/models`` says about the session's model."""
    meta = {
        "arch": session.arch,
        "n_ctx": session.n_ctx,
        "n_expert": session.n_expert,
        "n_expert_used": session.n_expert_used,
        "think_ctl": session.think_ctl,
        "decide": session.config.decide.enabled,
        "moe_stream": session.streaming is not None,
    }
    return ModelCard(id=name, created=int(time.time()), meta=meta)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket (``port`` 0: a free one); clients that connect before the
    server runs wait in the backlog."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def open_served(args: argparse.Namespace) -> ServedSession:
    """Open the session the parsed flags describe (raises ``BmoeError``)."""
    defaults = serve_defaults(args)
    model_path = resolve_model(args, "bmoe.serve")
    session = Session.open(session_config(args, model_path))
    return ServedSession(session, model_card(session, model_id(args, model_path)), defaults)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_devices:
        return list_devices(args)
    if args.max_tokens is not None and args.max_tokens < 0:
        parser.error("--max-tokens must be >= 0")
    try:
        from bmoe.serve.app import build_app
        from bmoe.serve.http_server import HttpServer
    except ImportError as exc:
        print(
            f"bmoe.serve: error: {exc}: install the server's extra, "
            ".venv/bin/pip install -e '.[server]' (from a checkout of bmoe)",
            file=sys.stderr,
        )
        return 1
    try:
        options = http_options(args)
        served = open_served(args)
    except BmoeError as exc:
        print(f"bmoe.serve: error: {exc}", file=sys.stderr)
        return 1
    stopping = Stopping(lambda: None)  # SIGTERM as Ctrl-C: the HTTP server asked to stop
    with stopping.installed():
        return _serve(args, options, served, stopping, HttpServer, build_app)


def _serve(
    args: argparse.Namespace,
    options: HttpOptions,
    served: ServedSession,
    stopping: Stopping,
    server_class: type[HttpServer],
    build_app: Callable[[ServedSession, HttpOptions], Any],
) -> int:
    """Serve until a signal, then close ``served`` (its session writes the prompt cache)."""
    try:
        for note in served.session.notes:
            print(f"bmoe.serve: {note}", file=sys.stderr)
        if served.session.governor is not None:
            served.session.governor.on_change = lambda change: print(
                f"bmoe.serve: moe-governor: {change.text()}", file=sys.stderr
            )
        try:
            sock = listen(args.host, args.port)
        except OSError as exc:
            print(f"bmoe.serve: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        with sock:
            server = server_class.of(build_app(served, options), args.log_level)
            stopping.on_first = server.stop
            if stopping.asked:  # a signal came before the server was made
                server.stop()
            host, port = sock.getsockname()[:2]
            url = f"http://{host}:{port}/v1"
            if not options.api_keys and not _loopback(host):
                print(
                    f"bmoe.serve: warning: listening on {host} without --api-key: whoever reaches this "
                    "port uses the model",
                    file=sys.stderr,
                )
            print(f"bmoe.serve: serving '{served.model_id}' on {url}", file=sys.stderr)
            print(f"bmoe.serve: chat and engine view: http://{host}:{port}/", file=sys.stderr, flush=True)
            server.run(sockets=[sock])
    finally:
        served.close()
    return 0
