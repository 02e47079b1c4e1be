"""The server an agent talks to: a ``bmoe.serve`` started for it (its output in a log file),
or one already listening on the port with the same model, started by an earlier launch
(whose key a state file under bmoe's cache root, ``launch/PORT.json``, keeps)."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import attrs

from bmoe.adapters.cache_dirs import cache_root
from bmoe.adapters.file_writes import make_folder, write_file
from bmoe.errors import BmoeError

HEALTH_TIMEOUT_S = 900.0  # a large model's load, from a slow disk


class LaunchError(BmoeError):
    """The server could not be started or reached; the message says why."""


def state_dir() -> Path:
    return cache_root() / "launch"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _get(url: str, key: str = "", timeout: float = 5.0) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (urllib.error.URLError, OSError):
        return 0, b""


def model_id(url: str, key: str) -> str:
    """The model id the server reports (``/v1/models``)."""
    status, body = _get(f"{url}/v1/models", key)
    if status != 200:
        raise LaunchError(f"{url}/v1/models answered {status or 'nothing'}")
    return str(json.loads(body)["data"][0]["id"])


@attrs.define
class Server:
    """A server to talk to: its address and key; ``process`` where this launch started it."""

    url: str
    key: str
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def stop(self) -> None:
        """Stop the server this launch started (SIGTERM: it ends as on Ctrl-C, then exits)."""
        p = self.process
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def reuse(host: str, port: int, model: list[str]) -> Server | None:
    """The server an earlier launch left on ``port`` with the same model flags, if it answers."""
    url = f"http://{host}:{port}"
    if _get(f"{url}/health")[0] != 200:
        return None
    state = state_dir() / f"{port}.json"
    try:
        doc = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    if doc.get("model") != model or _get(f"{url}/v1/models", str(doc.get("key", "")))[0] != 200:
        raise LaunchError(
            f"{url} is in use by another server (another model, or one this launch did not start): "
            "--port another"
        )
    return Server(url, str(doc["key"]))


def start(host: str, port: int, model: list[str], flags: list[str]) -> Server:
    """``python -m bmoe.serve`` with ``flags`` and a new random key, its output in a log file;
    returns once ``/health`` answers (``LaunchError`` with the log's end where it exits)."""
    key = secrets.token_urlsafe(24)
    folder = make_folder(state_dir(), "the launched server's log and key")
    log = folder / f"{port}.log"
    argv = [
        sys.executable,
        "-m",
        "bmoe.serve",
        *flags,
        "--host",
        host,
        "--port",
        str(port),
        f"--api-key={key}",
    ]
    with log.open("wb") as out:
        # its own session: the terminal's Ctrl-C goes to the agent (which uses it), not the server
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(f"http://{host}:{port}", key, process, log)
    state = folder / f"{port}.json"
    write_file(
        state, json.dumps({"model": model, "key": key, "pid": process.pid}), "the server's key", mode=0o600
    )
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while _get(f"{server.url}/health")[0] != 200:
        if process.poll() is not None:
            with contextlib.suppress(OSError):
                state.unlink()
            tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise LaunchError(f"bmoe.serve exited ({process.returncode}) before it served:\n{tail}")
        if time.monotonic() > deadline:
            server.stop()
            raise LaunchError(f"bmoe.serve did not answer /health in {HEALTH_TIMEOUT_S:.0f} s (log: {log})")
        time.sleep(0.2)
    return server
