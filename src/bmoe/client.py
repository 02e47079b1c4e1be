"""``SessionClient``: drive ``python -m bmoe.cli --session`` from another Python program.

Spawns the session process, sends JSON requests, and yields the parsed ``BMOE_*``
responses (``bmoe.adapters.protocol``). A reader thread collects responses, so a request
can be cancelled while you wait for it.

    with SessionClient(["-m", "model.gguf", "--chatml"]) as client:
        done = client.generate("Hello", n_predict=32)
        print(done.text)
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from bmoe.adapters.protocol import (
    Begin,
    DecideDone,
    Done,
    Error,
    Progress,
    ProtocolError,
    Ready,
    Response,
    ResponseReader,
)
from bmoe.domain.crash import crash_line_in
from bmoe.errors import BmoeError

_EOF = object()
_STDERR_LINES = 20  # the child's last stderr lines kept for an error message


class SessionClientError(BmoeError, RuntimeError):
    """The session process ended or answered something unexpected."""


class SessionCrashedError(SessionClientError):
    """The session process died of a signal; the message is the line it printed on the way
    (``bmoe: the process died of SIGSEGV while running ...``), then its last stderr lines."""


class SessionClient:
    """One ``--session`` process. ``args`` are extra CLI flags (``-m``, ``--chatml``...)."""

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        python: str = sys.executable,
        timeout: float = 300.0,
        stderr: int | None = subprocess.PIPE,
    ) -> None:
        """``timeout``: the most seconds to wait for any response, ``BMOE_READY`` included.
        ``stderr``: where the child's stderr goes; by default its last lines are kept
        (``stderr_tail``) and quoted in the error raised when the child ends or hangs.

        If ``BMOE_READY`` does not come (the child fails to open the model, dies, or says
        nothing within ``timeout``), the child is killed and reaped and
        ``SessionClientError`` says why, with the child's last stderr lines."""
        self.timeout = timeout
        self.process = subprocess.Popen(
            [python, "-m", "bmoe.cli", "--session", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        self._stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self._stderr_thread: threading.Thread | None = None
        if stderr == subprocess.PIPE:
            self._stderr_thread = threading.Thread(
                target=self._drain_stderr, name="bmoe-client-err", daemon=True
            )
            self._stderr_thread.start()
        self._responses: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._read, name="bmoe-client", daemon=True)
        self._thread.start()
        try:
            first = self.next_response()
            if not isinstance(first, Ready):
                why = first.msg if isinstance(first, Error) else str(first)
                raise SessionClientError(f"the session did not start: {why}")
        except BaseException as exc:
            self._kill()
            if isinstance(exc, SessionClientError | ProtocolError):
                raise SessionClientError(f"{exc}{self._stderr_note()}") from exc
            raise
        self.ready: Ready = first
        self._next_id = 0

    def _drain_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        for raw in stream:
            self._stderr.append(raw.decode("utf-8", "replace").rstrip("\r\n"))

    @property
    def stderr_tail(self) -> list[str]:
        """The child's last stderr lines (when its stderr is captured, the default); once
        the child has ended, all it wrote is in."""
        if self._stderr_thread is not None and self.process.poll() is not None:
            self._stderr_thread.join(timeout=1.0)
        return list(self._stderr)

    def _stderr_note(self) -> str:
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=1.0)
        if not self._stderr:
            return ""
        return "; its last stderr lines:\n" + "\n".join(self._stderr)

    def _kill(self) -> None:
        """Kill and reap the child (nothing if it already ended)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def _read(self) -> None:
        reader = ResponseReader()
        stdout = self.process.stdout
        assert stdout is not None
        try:
            for line in stdout:
                for response in reader.feed(line):
                    self._responses.put(response)
            for response in reader.feed_eof():
                self._responses.put(response)
        except ProtocolError as exc:
            self._responses.put(exc)
        finally:
            self._responses.put(_EOF)

    # -- low level -------------------------------------------------------------------------

    def send(self, request: dict[str, Any]) -> None:
        """Write one request line."""
        self.send_raw(json.dumps(request).encode() + b"\n")

    def send_raw(self, line: bytes) -> None:
        """Write bytes as they are (for testing malformed input)."""
        stdin = self.process.stdin
        if stdin is None or stdin.closed:
            raise SessionClientError("the session's input is closed")
        try:
            stdin.write(line)
            stdin.flush()
        except BrokenPipeError as exc:
            raise self._ended() from exc

    def _ended(self) -> SessionClientError:
        """The error for a process that ended: ``SessionCrashedError`` where it printed the
        crash line, with that line first."""
        status = self.process.wait()
        note = self._stderr_note()
        line = crash_line_in(self._stderr)
        if line is not None:
            return SessionCrashedError(f"{line} (exit status {status}){note}")
        return SessionClientError(f"the session process ended (exit status {status}){note}")

    def next_response(self) -> Response:
        """The next response line, parsed; raises if the process ended."""
        try:
            item = self._responses.get(timeout=self.timeout)
        except queue.Empty as exc:
            raise SessionClientError(f"no response within {self.timeout} s") from exc
        if item is _EOF:
            self._responses.put(_EOF)
            raise self._ended()
        if isinstance(item, ProtocolError):
            raise item
        assert isinstance(item, Ready | Begin | Progress | Done | DecideDone | Error)
        return item

    def responses_until_final(self) -> Iterator[Response]:
        """Responses up to and including the next ``Done``, ``DecideDone`` or ``Error``."""
        while True:
            response = self.next_response()
            yield response
            if isinstance(response, Done | DecideDone | Error):
                return

    def _id(self, given: Any) -> Any:
        if given is not None:
            return given
        self._next_id += 1
        return self._next_id

    # -- requests --------------------------------------------------------------------------

    def generate(self, prompt: str, *, id: Any = None, **fields: Any) -> Done:
        """Run a generate and return its ``Done``; raise ``SessionClientError`` on an error."""
        final = list(self.stream_generate(prompt, id=id, **fields))[-1]
        if isinstance(final, Error):
            raise SessionClientError(final.msg)
        assert isinstance(final, Done)
        return final

    def stream_generate(self, prompt: str, *, id: Any = None, **fields: Any) -> Iterator[Response]:
        """Send a generate and yield its responses (``Begin``, ``Progress``..., ``Done``)."""
        self.send({"cmd": "generate", "id": self._id(id), "prompt": prompt, **fields})
        return self.responses_until_final()

    def decide(
        self, prefix: str, suffix: str, choices: Sequence[str], *, id: Any = None, **fields: Any
    ) -> Response:
        """Send a decision and return its ``DecideDone`` (or ``Error``)."""
        self.send(
            {
                "cmd": "decide",
                "id": self._id(id),
                "prefix": prefix,
                "suffix": suffix,
                "choices": list(choices),
                **fields,
            }
        )
        return list(self.responses_until_final())[-1]

    def cancel(self, id: Any = None) -> None:
        self.send({"cmd": "cancel"} if id is None else {"cmd": "cancel", "id": id})

    def close(self) -> int:
        """End the session (``close``) and return the process's exit status."""
        if self.process.poll() is None:
            try:
                self.send({"cmd": "close"})
                assert self.process.stdin is not None
                self.process.stdin.close()
            except (BrokenPipeError, SessionClientError):
                pass
        try:
            return self.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
