"""Command line of bmoe: ``python -m bmoe.cli`` (also installed as ``bmoe``).

One-shot mode: ``-p PROMPT -n N`` generates once, prints the answer on stdout and a summary
on stderr. With no ``-m`` it runs on the built-in tiny model (generated on first use).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import attrs

from bmoe.adapters.protocol import Error, encode_response
from bmoe.cli.session_loop import SessionLoop
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.media import MEDIA_MARKER, Image
from bmoe.domain.metrics import MemorySample, parse_proc_status, preamble, row_line, run_summary, token_row
from bmoe.domain.metrics import trailer as metrics_trailer
from bmoe.domain.perplexity import PplAccumulator, PplWindow
from bmoe.domain.streaming import MIB
from bmoe.domain.summary import generation_line, stream_lines, stream_mode_line, timing_line
from bmoe.errors import BmoeError, ConfigError
from bmoe.frontend.configs import resolve_model, sampling_params, session_config
from bmoe.frontend.devices import list_devices
from bmoe.frontend.flags import (
    add_context_options,
    add_decide_options,
    add_model_options,
    add_run_options,
    add_stream_options,
)
from bmoe.frontend.stopping import Stopping
from bmoe.runtime import Session, SessionConfig

DEFAULT_PROMPT = "Hello, world"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.cli",
        description="Run a Mixture-of-Experts GGUF model with bmoe.",
        epilog="With no -m, a tiny random-weight model (qwen3moe) is generated and used: "
        "its output is gibberish, but every part of the engine runs.",
    )
    add_model_options(p)
    p.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help="prompt text (default: %(default)r)")
    p.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate (default: 32)")
    p.add_argument(
        "--image",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="an image for the prompt (repeatable; needs --mmproj): placed where the prompt says "
        f"{MEDIA_MARKER}, else in front of it, as llama.cpp's mtmd-cli does",
    )
    add_context_options(p)
    p.add_argument(
        "--chatml", action="store_true", help="wrap the prompt as a user turn with the chat template"
    )
    add_run_options(p, server=False)
    p.add_argument(
        "--ppl",
        type=Path,
        default=None,
        metavar="FILE",
        help="perplexity of FILE's text in windows of -c tokens, as llama.cpp's perplexity tool "
        "computes it (needs at least 2 windows of text)",
    )
    p.add_argument(
        "--csv",
        type=Path,
        default=None,
        metavar="FILE",
        help="write per-token metrics to FILE (bmoe_metrics v2 CSV: configuration, one row per token, "
        "summary; read it with python -m bmoe.report FILE)",
    )
    add_stream_options(p)
    s = p.add_argument_group("session mode (docs/protocol.md)")
    s.add_argument(
        "--session",
        action="store_true",
        help="load once, then serve JSON requests from stdin with BMOE_* lines on stdout",
    )
    s.add_argument(
        "--progress",
        action="store_true",
        help="with --session: a BMOE_PROGRESS line per token; one-shot: a live display on stderr "
        "(tokens, tok/s, hit rate, MiB read)",
    )
    add_decide_options(s, "with --session: accept decide requests (docs/decide.md)")
    return p


def prompt_images(prompt: str, files: Sequence[Path]) -> tuple[str, tuple[Image, ...]]:
    """``--image`` files read, and the prompt with a marker for each where it has none
    (``ConfigError`` for a file that cannot be read)."""
    images = []
    for path in files:
        try:
            images.append(Image(path.read_bytes(), name=f"--image {path}"))
        except OSError as exc:
            raise ConfigError(f"--image {path}: {exc.strerror}") from None
    if images and MEDIA_MARKER not in prompt:
        prompt = MEDIA_MARKER * len(images) + prompt
    return prompt, tuple(images)


def _config(args: argparse.Namespace) -> SessionConfig:
    """The shared flags' session (``bmoe.frontend``), with the CLI's own: ``--chatml``, ``-n``."""
    config = session_config(args, resolve_model(args, "bmoe"))
    return attrs.evolve(config, chat=args.chatml, n_predict=args.n_predict)


def _open(config: SessionConfig) -> Session:
    """Open the session, showing the loading on stderr when it takes more than a second."""
    from bmoe.cli.live import LoadProgress

    shown = LoadProgress()
    try:
        session = Session.open(config, on_load=shown)
    finally:
        shown.close()
    if session.governor is not None:
        session.governor.on_change = lambda change: print(f"moe-governor: {change.text()}", file=sys.stderr)
    return session


def _serve(args: argparse.Namespace) -> int:
    # stdout is the protocol: when llama.cpp aborts the process (an RPC server that died),
    # ggml's backtrace (gdb's output, on stdout) must not reach it; its message goes to stderr
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    try:
        session = _open(_config(args))
        for note in session.notes:
            print(f"bmoe: {note}", file=sys.stderr)
    except BmoeError as exc:
        sys.stdout.buffer.write(encode_response(Error(id=None, fatal=True, msg=str(exc))))
        sys.stdout.flush()
        return 1
    loop = SessionLoop(
        session, sys.stdin.buffer, sys.stdout.buffer, progress=args.progress, sampling=sampling_params(args)
    )
    # SIGTERM as Ctrl-C: serve no more, close the session (the prompt cache written), exit 0
    with Stopping(loop.stop).installed(), session:
        return loop.run()


def _perplexity(args: argparse.Namespace) -> int:
    """``--ppl FILE``: print each window's running figure as llama.cpp's tool does
    (``[1]12.3456,[2]...``), then ``Final estimate: PPL = X +/- Y``."""
    try:
        text = args.ppl.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"bmoe: error: cannot read {args.ppl}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        with _open(_config(args)) as session:
            for note in session.notes:
                print(f"bmoe: {note}", file=sys.stderr)
            t0 = time.perf_counter()

            def window(w: PplWindow, acc: PplAccumulator) -> None:
                print(f"[{w.index + 1}]{acc.ppl:.4f},", end="", flush=True)

            acc = session.perplexity_windows(text, args.ctx_size, window)
            elapsed = time.perf_counter() - t0
    except BmoeError as exc:
        print(f"\nbmoe: error: {exc}", file=sys.stderr)
        return 1
    print()
    print(f"Final estimate: PPL = {acc.ppl:.4f} +/- {acc.error:.5f}")
    print(f"perplexity: {acc.count} tokens scored in {elapsed:.2f} s", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_devices:
        return list_devices(args)
    if args.decide and not args.session:
        parser.error("--decide needs --session")
    if args.decide_probe is not None and not args.decide:
        parser.error("--decide-probe needs --decide")
    if args.csv is not None and (args.session or args.ppl is not None):
        parser.error("--csv is for one-shot generation (not --session nor --ppl)")
    if args.session:
        return _serve(args)
    if args.ppl is not None:
        return _perplexity(args)
    csv_file: TextIO | None = None
    if args.csv is not None:
        try:
            csv_file = args.csv.open("w", encoding="utf-8", newline="")
        except OSError as exc:
            print(f"bmoe: error: cannot write {args.csv}: {exc.strerror}", file=sys.stderr)
            return 1
    try:
        return _one_shot(args, csv_file)
    finally:
        if csv_file is not None:
            csv_file.close()


def _memory() -> MemorySample:
    """This process's resident memory (``/proc/self/status``; -1 where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            return parse_proc_status(f.read())
    except OSError:
        return MemorySample()


def _metrics_config(args: argparse.Namespace, config: SessionConfig, session: Session) -> dict[str, object]:
    """The ``--csv`` preamble: what the run was."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        bmoe_version = version("bmoe")
    except PackageNotFoundError:
        bmoe_version = "unknown"
    items: dict[str, object] = {
        "bmoe_version": bmoe_version,
        "model": str(config.model_path),
        "arch": session.arch,
        "n_expert": session.n_expert,
        "n_expert_used": session.n_expert_used,
        "n_ctx": session.n_ctx,
        "prompt_batch": session.config.context.n_batch,
        "threads": config.context.n_threads,
        "n_predict": args.n_predict,
        "chatml": args.chatml,
        "temp": args.temp,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "moe_stream_requested": args.moe_stream,
        "streaming": session.streaming is not None,
    }
    if session.streaming is not None:
        info = session.streaming.info
        items.update(
            cache_budget_mib=info.budget.bytes / MIB,
            cache_budget_auto=info.budget.auto,
            lanes=info.lanes,
            odirect=info.odirect,
            prefetch=config.stream.prefetch,
            policy=config.stream.policy,
        )
    return items


def _one_shot(args: argparse.Namespace, csv_file: TextIO | None) -> int:
    try:
        config = _config(args)
        if config.cache_disk is None:  # one conversation, ended with the run: no state to keep
            config = attrs.evolve(config, cache_ram_mb=0)  # (nor room to set aside for one)
        prompt, images = prompt_images(args.prompt, args.image)
        request = GenerateRequest(prompt=prompt, sampling=sampling_params(args), images=images)
        display = None
        if args.progress:
            from bmoe.cli.live import make_display

            display = make_display()

        def echo(progress: Progress) -> None:
            if progress.delta_text:
                sys.stdout.write(progress.delta_text)
                if display is None or not display.holds_stdout:
                    sys.stdout.flush()
            if csv_file is not None:
                csv_file.write(row_line(token_row(progress, _memory())))
            if display is not None:
                display.update(progress)

        with _open(config) as session:
            for note in session.notes:
                print(f"bmoe: {note}", file=sys.stderr)
            if csv_file is not None:
                csv_file.write(preamble(_metrics_config(args, config, session)))
            try:
                result = session.generate(request, on_progress=echo)
            finally:
                if display is not None:
                    display.close()
            if session.streaming is not None:
                info = session.streaming.info
                batch = session.streaming.prompt_batch or session.config.context.n_ubatch
                mode = stream_mode_line(info.budget, info.lanes, info.odirect, batch)
            else:
                mode = "mode: resident" + ("" if args.moe_stream else " (expert streaming not enabled)")
            if session.n_expert:
                mode += f"; {session.arch}, {session.n_expert} experts, top-{session.n_expert_used}"
            mode += f"; {session.weight_layout.summary()}"
            if session.placement_line:
                mode += f"; {session.placement_line}"
            load_s = session.load_s
            n_ubatch = session.config.context.n_ubatch
            if csv_file is not None:
                csv_file.write(metrics_trailer(run_summary(result, load_s)))
    except BmoeError as exc:
        print(f"\nbmoe: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if csv_file is None:
            raise
        print(f"\nbmoe: error: while writing {args.csv}: {exc}", file=sys.stderr)
        return 1
    print()
    if result.reasoning:
        print(f"reasoning: {result.reasoning!r}", file=sys.stderr)
    print(generation_line(result), file=sys.stderr)
    print(mode, file=sys.stderr)
    for line in stream_lines(result):
        print(line, file=sys.stderr)
    print(timing_line(result, load_s, n_ubatch), file=sys.stderr)
    return 0
