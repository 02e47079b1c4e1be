"""README.md runs as written: each ``sh`` block's ``.venv/bin/python`` commands (a
``jsonl`` block after one is its stdin), each ``python`` block, on the built-in model, in
this environment (the Quick start made it; its ``pip`` and ``venv`` steps and the test
command itself are not re-run). A server command is started, asked for ``/v1/models`` and
stopped; a command sent to the background (``... &``, the RPC server) is started, waited for
on its port while the block's other commands run, then stopped. A block the README marks
``<!-- readme-test: skip (why) -->`` is skipped, saying why.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import attrs
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SKIP = re.compile(r"<!-- readme-test: skip \((.*)\) -->")
FENCE = re.compile(r"^```(\w*)\s*$")


@attrs.frozen
class Block:
    lang: str
    text: str
    line: int
    skip: str = ""


def blocks() -> list[Block]:
    found: list[Block] = []
    lines = README.read_text(encoding="utf-8").splitlines()
    i, skip = 0, ""
    while i < len(lines):
        marker = SKIP.search(lines[i])
        fence = FENCE.match(lines[i])
        if marker:
            skip = marker.group(1)
        elif fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            found.append(Block(fence.group(1), "\n".join(lines[i + 1 : end]), i + 1, skip))
            i, skip = end, ""
        i += 1
    return found


def commands() -> list[tuple[str, str, str]]:
    """``(id, command, stdin)`` for every ``.venv/bin/python`` command in ``sh`` blocks; a
    block with a command sent to the background (``... &``) is one entry, its lines joined."""
    out = []
    found = blocks()
    for n, block in enumerate(found):
        if block.lang != "sh":
            continue
        stdin = found[n + 1].text + "\n" if n + 1 < len(found) and found[n + 1].lang == "jsonl" else ""
        stdin = stdin if not block.skip else f"SKIP:{block.skip}"
        parts = [p.strip() for line in block.text.splitlines() for p in line.split("&&")]
        parts = [p for p in parts if p.startswith(".venv/bin/python") and " -m pytest" not in p]
        if any(_background(p) for p in parts):
            out.append((f"README.md:{block.line}", "\n".join(parts), stdin))
            continue
        out += [(f"README.md:{block.line}", part, stdin) for part in parts]
    return out


def _background(command: str) -> bool:
    return command.split("  #")[0].rstrip().endswith("&")


def _argv(command: str) -> list[str]:
    argv = shlex.split(command.split("  #")[0].rstrip(" &"))
    return [sys.executable, *argv[1:]]


@pytest.mark.parametrize(("where", "command", "stdin"), commands(), ids=[c[0] for c in commands()])
def test_each_readme_command_runs_as_written(where: str, command: str, stdin: str, tmp_path: Path) -> None:
    if stdin.startswith("SKIP:"):
        pytest.skip(f"{where}: {stdin[5:]}")
    if "\n" in command:
        _with_background(command.splitlines(), tmp_path)
        return
    argv = _argv(command)
    if "bmoe.serve" in command:
        _serve(argv, tmp_path)
        return
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stderr[-3000:]}"
    if stdin:  # a session (docs/protocol.md): one answer per request line, none an error
        kinds = [line.split(" ", 1)[0] for line in proc.stdout.splitlines()]
        assert "BMOE_ERROR" not in kinds, proc.stdout
        answered = [k for k in kinds if k in ("BMOE_DONE", "BMOE_DECIDE")]
        assert len(answered) == len(stdin.strip().splitlines()), proc.stdout


def _with_background(lines: list[str], cwd: Path) -> None:
    """Start the block's ``&`` commands, wait for the port each names, run the rest, stop them."""
    if any("bmoe.rpc_server" in line for line in lines):
        from bmoe.adapters.llama.devices import rpc_available

        if not rpc_available():
            pytest.skip('llama-cpp-python was built without its RPC backend (CMAKE_ARGS="-DGGML_RPC=ON")')
    started = []
    try:
        for line in lines:
            argv = _argv(line)
            if not _background(line):
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd)
                assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
                continue
            started.append(
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
            )
            if "--port" in argv:
                _wait_for_port(int(argv[argv.index("--port") + 1]), started[-1])
    finally:
        for proc in started:
            proc.kill()
            proc.wait(timeout=60)


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert proc.poll() is None, "the background command ended"
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}")


def _serve(argv: list[str], cwd: Path) -> None:
    """Start the server as written (its port moved to a free one), ask it, stop it."""
    argv = [*argv, "--port", "0"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        url = ""
        deadline = time.monotonic() + 300
        assert proc.stderr is not None
        while not url and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            found = re.search(r"on (http://\S+/v1)", line)
            url = found.group(1) if found else ""
        assert url, f"the server did not start: exit {proc.poll()}"
        with urllib.request.urlopen(f"{url}/models", timeout=30) as answer:
            assert json.load(answer)["data"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.parametrize(
    "block", [b for b in blocks() if b.lang == "python"], ids=lambda b: f"README.md:{b.line}"
)
def test_each_readme_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    if block.skip:
        pytest.skip(block.skip)
    proc = subprocess.run(
        [sys.executable, "-c", block.text], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_readme_has_what_this_test_runs() -> None:
    """The parser finds the blocks (a README rewritten past it would silently pass)."""
    langs = [b.lang for b in blocks()]
    assert langs.count("python") >= 1 and langs.count("jsonl") >= 1
    assert len([c for c in commands() if not c[2].startswith("SKIP:")]) >= 4
