"""``python -m bmoe.launch claude|codex|opencode [--port P] [--host H] [model flags]``: a
coding agent on bmoe in one command (docs/server.md, "Coding agents").

1. The plan (``bmoe.runtime.planning``) for an agent's work: a context for the client's
   usual first request (a 15-20k-token system prompt and tools) plus room to work, ``-np 2``
   (the side requests an agent sends beside its main one), ``--cache-disk`` under bmoe's
   cache root (a restart does not prefill that prompt again), the cache and prompt batch
   the plan takes. A flag given among the model flags wins over the plan's.
2. ``bmoe.serve`` started with those flags and a random key (or the server an earlier launch
   left on the port with the same model), waited for on ``/health``.
3. The client, where it is on PATH, run with its environment set (``bmoe.launch.clients``);
   the server stops when it exits. Where it is not, the exact configuration to paste is
   printed and the server keeps serving until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from bmoe.domain.plan.predict import PlanSettings
from bmoe.errors import BmoeError
from bmoe.launch.clients import CLIENTS, Target, launch, paste
from bmoe.launch.server import LaunchError, Server, free_port, model_id, reuse, start, state_dir
from bmoe.runtime.planning import MachineOptions, plan_hf, plan_local

AGENT_PROMPT_TOKENS = 20000  # Claude Code's or Codex's first request: system prompt and tools
AGENT_PARALLEL = 2
_OWN = {"--port", "--host", "--disk-mib-s"}  # launch's options (the rest goes to bmoe.serve)
_PLANNED = {  # the plan's flags, and each one's spellings a user may give instead
    "--cache-mb": ("--cache-mb",),
    "-c": ("-c", "--ctx-size"),
    "-b": ("-b", "--batch-size"),
    "-np": ("-np", "--parallel"),
    "--cache-disk": ("--cache-disk",),
}


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """launch's own options, and the model flags passed through to ``bmoe.serve``."""
    p = argparse.ArgumentParser(prog="python -m bmoe.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("client", choices=CLIENTS)
    p.add_argument("--port", type=int, default=8080, help="the server's port; 0 picks a free one")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--disk-mib-s", type=float, help="the disk's speed for the plan (default: measured)")
    own, rest = [], []
    i = 0
    while i < len(argv):
        if argv[i] in _OWN and i + 1 < len(argv):
            own += argv[i : i + 2]
            i += 2
        elif i == 0 or argv[i] in ("-h", "--help"):
            own.append(argv[i])
            i += 1
        else:
            rest.append(argv[i])
            i += 1
    return p.parse_args(own), rest


def _value(flags: list[str], *names: str) -> str | None:
    for i, flag in enumerate(flags[:-1]):
        if flag in names:
            return flags[i + 1]
    return None


def model_flags(flags: list[str]) -> list[str]:
    """The flags that name the model (for the plan, and to recognise a server to reuse)."""
    out: list[str] = []
    for names in (("-m", "--model"), ("-hf", "-hfr", "--hf-repo"), ("-hff", "--hf-file")):
        if (value := _value(flags, *names)) is not None:
            out += [names[0], value]
    return out


def agent_flags(flags: list[str], disk_mib_s: float | None) -> list[str]:
    """The plan's flags for an agent, less those the user gave, before the user's."""
    settings = PlanSettings(prompt_tokens=(AGENT_PROMPT_TOKENS,), n_parallel=AGENT_PARALLEL)
    options = MachineOptions(disk_mib_s=disk_mib_s)
    path, spec = _value(flags, "-m", "--model"), _value(flags, "-hf", "-hfr", "--hf-repo")
    if spec is not None:
        planned = plan_hf(spec, _value(flags, "-hff", "--hf-file"), settings, options)
    else:
        from bmoe.tinymodel import default_model_path

        planned = plan_local(Path(path) if path else default_model_path(), settings, options)
    for note in planned.plan.notes():
        print(f"bmoe.launch: plan: {note}", file=sys.stderr)
    chosen = planned.plan.flags()
    out = [] if "--moe-stream" in flags else ["--moe-stream"]
    for flag, spellings in _PLANNED.items():
        if flag in chosen and not any(s in flags for s in spellings):
            at = chosen.index(flag)
            out += chosen[at : at + 2]
    return [*out, *flags]


def run(argv: list[str]) -> int:
    args, flags = split_args(argv)
    port = free_port(args.host) if args.port == 0 else args.port
    model = model_flags(flags)
    server = reuse(args.host, port, model)
    if server is None:
        serve_flags = agent_flags(flags, args.disk_mib_s)
        print(f"bmoe.launch: python -m bmoe.serve {' '.join(serve_flags)} --port {port}", file=sys.stderr)
        server = start(args.host, port, model, serve_flags)
        print(f"bmoe.launch: serving at {server.url} (log: {server.log})", file=sys.stderr)
    else:
        print(f"bmoe.launch: using the server already at {server.url}", file=sys.stderr)
    try:
        return _with_server(args.client, server)
    finally:
        server.stop()


def _with_server(client: str, server: Server) -> int:
    target = Target(server.url, server.key, model_id(server.url, server.key))
    exe = shutil.which(client)
    if exe is not None:
        how = launch(client, target, state_dir() / client)
        print(f"bmoe.launch: running {exe} against {server.url}", file=sys.stderr)
        # Ctrl-C is the agent's (it interrupts a reply); the server stops when the agent exits
        before = signal.signal(signal.SIGINT, lambda *_: None)
        try:
            return subprocess.run([exe, *how.args], env={**os.environ, **how.env}).returncode
        finally:
            signal.signal(signal.SIGINT, before)
    print(f"bmoe.launch: {client} is not on PATH; its configuration:\n", file=sys.stderr)
    print(paste(client, target), flush=True)
    print(f"bmoe.launch: serving at {server.url}; Ctrl-C stops it", file=sys.stderr, flush=True)
    if server.process is None:
        signal.pause()  # a server an earlier launch started: it keeps serving after this one
        return 0
    return server.process.wait()


def main(argv: list[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return 130
    except (LaunchError, BmoeError) as exc:
        print(f"bmoe.launch: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
