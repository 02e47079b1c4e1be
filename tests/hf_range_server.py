"""A local stand-in for the Hugging Face Hub's file API, for the ``-hf`` planning gates:
``GET /api/models/{repo}`` lists the files, ``GET /{repo}/resolve/main/{file}`` serves one
with HTTP range requests (206, ``Content-Range``), counting every byte it sends per file;
``HEAD`` on it answers the headers ``huggingface_hub``'s ``hf_hub_download`` reads (commit,
ETag, size), so downloads run against it too. ``mode`` makes it misbehave: ``no-range``
answers 200 with the whole file; ``cut`` sends half of a whole file, then closes."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class HubStandIn:
    def __init__(self, files: dict[str, dict[str, bytes | Path]], mode: str = "") -> None:
        self.files = files  # repo -> name in the repository -> its content (bytes or a file)
        self.mode = mode
        self.served: dict[str, int] = {}  # "repo/name" -> bytes sent
        self.url = ""

    def content(self, repo: str, name: str) -> bytes | None:
        got = self.files.get(repo, {}).get(name)
        if isinstance(got, Path):
            return got.read_bytes()
        return got


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            path = urllib.parse.unquote(self.path)
            repo, sep, name = path.lstrip("/").partition("/resolve/main/")
            data = hub.content(repo, name) if sep else None
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", "0" * 40)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

        def do_GET(self) -> None:
            path = urllib.parse.unquote(self.path)
            if path.startswith("/api/models/"):
                repo = path[len("/api/models/") :]
                if repo not in hub.files:
                    self.send_error(404)
                    return
                body = json.dumps({"siblings": [{"rfilename": n} for n in hub.files[repo]]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            repo, sep, name = path.lstrip("/").partition("/resolve/main/")
            data = hub.content(repo, name) if sep else None
            if data is None:
                self.send_error(404)
                return
            match = _RANGE.match(self.headers.get("Range", ""))
            if hub.mode == "no-range" or match is None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self._send(f"{repo}/{name}", data[: len(data) // 2] if hub.mode == "cut" else data)
                return
            start = int(match.group(1))
            if start >= len(data):
                self.send_error(416)
                return
            end = min(len(data) - 1, int(match.group(2)) if match.group(2) else len(data) - 1)
            part = data[start : end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            self._send(f"{repo}/{name}", part)

        def _send(self, key: str, data: bytes) -> None:
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                return
            hub.served[key] = hub.served.get(key, 0) + len(data)

    return Handler


@contextmanager
def serving(hub: HubStandIn) -> Iterator[HubStandIn]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
