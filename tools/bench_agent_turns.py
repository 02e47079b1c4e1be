"""An agent's transcript, turn by turn: what each turn prefills, reads and waits for.

Two conversations take turns (an agent and its subagent, two editor windows): each starts
with the same long system prompt and tool list, and every turn adds a tool result of about
``--tool-tokens`` tokens and generates ``--gen`` tokens. Served four ways on one model:

- ``np1``: one context (``-np 1``), every request carrying its conversation, no prompt cache:
  a conversation that comes back finds the other one's KV and prefills its whole history;
- ``np1-cache``: the same with the prompt cache (``--cache-ram``): it restores its own state;
- ``np2-plain``: two slots (``-np 2``), both conversations' turns sent together, slots that
  never reuse a prefix (``--slot-prompt-similarity 1``: today's way before slots kept KV);
- ``np2``: two slots that keep their KV (the default);
- ``stock-cache``: llama-cpp-python's own ``Llama`` with its RAM prompt cache
  (``LlamaRAMCache``, what ``python -m llama_cpp.server --cache`` uses), resident, its
  defaults (weights repacked); it does not say what its prompt held nor what it prefilled
  (``-1``);
- ``stock-server``: the same transcript over HTTP against ``python -m llama_cpp.server``
  (``--cache True``, 512 MiB, its defaults otherwise), streamed chat completions (needs
  llama-cpp-python's ``server`` extra).

Reported per turn: tokens prefilled, tokens restored from the prompt cache, MiB of experts
read during the prefill (streamed), the time to the first token (from the request to its
first token: saving the other conversation's state and restoring this one's included), the
time the prefill of the new tokens alone took (``llama_decode`` of what was not restored),
and the first's ratio to the second; a markdown table on stdout. Run it inside the memory
and read limits to compare against (a cgroup: ``--mem-limit-mb``/``--disk-mib-s`` of
``python -m bmoe.bench`` describe one). Time figures move with the machine: run nothing else
meanwhile.

    python tools/bench_agent_turns.py -m model.gguf --cache-mb 1536 --modes np1,np1-cache
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import attrs

from bmoe.adapters.llama import ContextParams
from bmoe.bench.prefill import context_batch
from bmoe.bench.run_plan import parse_batch
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress, RunResult
from bmoe.domain.streaming import MIB, StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.service.parallel_jobs import ParallelEntry
from bmoe.tinymodel import default_model_path

MODES = ("np1", "np1-cache", "np2-plain", "np2", "stock-cache", "stock-server")
CODE = "def handler_{i}(request):\n    value = request.get('field_{i}', {i})\n    return value * {j} + {i}\n"


def filler(tokens: int, tokenize: Callable[[str], list[int]], seed: int) -> str:
    """Code-like text of about ``tokens`` tokens (a tool list, a file read)."""
    out: list[str] = []
    i = seed
    while len(tokenize("".join(out))) < tokens:
        out.append(CODE.format(i=i, j=i % 7 + 1))
        i += 1
    return "".join(out)


@attrs.define
class Turn:
    mode: str
    who: str
    turn: int
    prompt_tokens: int
    prefilled: int
    restored: int
    read_mib: float
    first_token_s: float
    prefill_s: float = -1.0  # the new tokens' llama_decode alone (-1: not known)

    @classmethod
    def of(cls, mode: str, who: str, turn: int, r: RunResult, read_mib: float, first_s: float) -> Turn:
        """A bmoe turn from its result."""
        prompt = r.n_past - len(r.tokens)
        return cls(mode, who, turn, prompt, r.n_prompt, r.n_restored, read_mib, first_s, r.prefill_s)


@attrs.define
class Sink:
    """A request's result, and when each of its tokens came (``time.perf_counter``)."""

    t0: float = attrs.Factory(time.perf_counter)
    at: list[float] = attrs.Factory(list)
    results: list[RunResult] = attrs.Factory(list)

    @property
    def first(self) -> float:
        """Seconds from ``t0`` to the first token (0 before it)."""
        return self.at[0] - self.t0 if self.at else 0.0

    def progress(self, p: Progress) -> None:
        self.at.append(time.perf_counter())

    def wants_stop(self) -> bool:
        return False

    def done(self, result: RunResult) -> None:
        self.results.append(result)

    def failed(self, error: BaseException) -> None:
        raise error


Deltas = Callable[[list[dict[str, str]]], Iterable[str | None]]
"""A stock reply streamed: the text pieces of the answer to a conversation's messages."""


def stock_transcript(
    mode: str, args: argparse.Namespace, system: str, tools: Sequence[str], reply: Deltas
) -> list[Turn]:
    """The two conversations' turns through a stock ``reply``: when each first token came."""
    turns: list[Turn] = []
    histories: dict[str, list[dict[str, str]]] = {w: [{"role": "system", "content": system}] for w in "ab"}
    for t in range(args.turns):
        for who in "ab":
            prompt = f"Tool result ({who}, turn {t}):\n{tools[2 * t + (who == 'b')]}"
            histories[who].append({"role": "user", "content": prompt})
            t0 = time.perf_counter()
            first, text = 0.0, []
            for delta in reply(histories[who]):
                if delta:
                    first = first or time.perf_counter() - t0
                    text.append(delta)
            histories[who].append({"role": "assistant", "content": "".join(text)})
            turns.append(Turn(mode, who, t, -1, -1, -1, 0.0, first))
    return turns


def run_stock(args: argparse.Namespace, system: str, tools: Sequence[str]) -> list[Turn]:
    """The transcript through llama-cpp-python's ``Llama`` and its RAM prompt cache."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(args.model),
        n_ctx=args.ctx,
        n_batch=context_batch(args.batch),
        n_threads=args.threads,
        verbose=False,
    )
    llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=512 << 20))

    def reply(messages: list[dict[str, str]]) -> Iterable[str | None]:
        chunks = llm.create_chat_completion(
            messages=messages, max_tokens=args.gen, temperature=0.0, stream=True
        )
        return (chunk["choices"][0]["delta"].get("content") for chunk in chunks)  # type: ignore[index]

    try:
        return stock_transcript("stock-cache", args, system, tools, reply)
    finally:
        llm.close()


def run_stock_server(args: argparse.Namespace, system: str, tools: Sequence[str]) -> list[Turn]:
    """The transcript against ``python -m llama_cpp.server`` with its prompt cache on
    (``--cache True``, RAM, 512 MiB), its defaults otherwise, streamed chat completions."""
    import openai

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(args.model),
        "--port",
        str(port),
        "--n_ctx",
        str(args.ctx),
        "--n_batch",
        str(context_batch(args.batch)),
        "--n_threads",
        str(args.threads),
        "--cache",
        "True",
        "--cache_size",
        str(512 << 20),
        "--verbose",
        "False",
    ]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=3600)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"llama_cpp.server did not start: {server.stderr.read() if server.stderr else ''}"
                    ) from None
                time.sleep(1)

        def reply(messages: list[dict[str, str]]) -> Iterable[str | None]:
            chunks = client.chat.completions.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=args.gen,
                temperature=0.0,
                stream=True,
            )
            return (chunk.choices[0].delta.content if chunk.choices else None for chunk in chunks)

        return stock_transcript("stock-server", args, system, tools, reply)
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_mode(mode: str, args: argparse.Namespace, system: str, tools: Sequence[str]) -> list[Turn]:
    if mode == "stock-cache":
        return run_stock(args, system, tools)
    if mode == "stock-server":
        return run_stock_server(args, system, tools)
    parallel = mode.startswith("np2")
    context = ContextParams(
        n_ctx=args.ctx,
        n_batch=context_batch(args.batch),
        n_ubatch=context_batch(args.batch),
        n_threads=args.threads,
        n_seq_max=2 if parallel else 1,
    )
    stream = stream_config(args)
    config = SessionConfig(
        model_path=args.model,
        context=context,
        chat=True,
        think=False,
        stream=stream,
        cache_ram_mb=512 if mode == "np1-cache" else 0,
        slot_similarity=1.0 if mode == "np2-plain" else 0.1,
    )
    turns: list[Turn] = []
    histories = {who: [ChatMessage("system", system)] for who in "ab"}
    with Session.open(config) as s:
        for t in range(args.turns):
            prompts = {who: f"Tool result ({who}, turn {t}):\n{tools[2 * t + (who == 'b')]}" for who in "ab"}
            before = s.streaming.counters() if s.streaming is not None else None
            if parallel:
                sinks = {who: Sink(time.perf_counter()) for who in "ab"}
                entries = [
                    ParallelEntry(
                        GenerateRequest(p, n_predict=args.gen), sinks[w], history=list(histories[w])
                    )
                    for w, p in prompts.items()
                ]
                pending = list(entries)

                def take(idle: bool, pending: list[ParallelEntry] = pending) -> list[ParallelEntry]:
                    out, pending[:] = list(pending), []
                    return out

                s.run_parallel(take)
                read = (s.streaming.counters() - before).bytes_read / MIB if s.streaming and before else 0.0
                for who in "ab":
                    r = sinks[who].results[0]
                    turns.append(Turn.of(mode, who, t, r, read / 2, sinks[who].first))
                    histories[who] += [ChatMessage("user", prompts[who]), ChatMessage("assistant", r.text)]
                continue
            for who in "ab":
                first = Sink(time.perf_counter())
                r = s.generate(
                    GenerateRequest(prompts[who], n_predict=args.gen, clear_kv=False),
                    history=histories[who],
                    on_progress=first.progress,
                )
                read = r.stream.prefill.bytes_read / MIB if r.stream is not None else 0.0
                turns.append(Turn.of(mode, who, t, r, read, first.first))
                histories[who] += [ChatMessage("user", prompts[who]), ChatMessage("assistant", r.text)]
    return turns


def stream_config(args: argparse.Namespace) -> StreamConfig:
    """Streamed with ``--cache-mb`` (else resident), the governor off; under ``-b auto`` the
    prompt batch sized from the room."""
    streamed = args.cache_mb is not None
    return StreamConfig(
        enabled=streamed,
        cache_mb=args.cache_mb,
        governor="off",
        size_prompt_batch=streamed and args.batch == "auto",
    )


def session_flags(p: argparse.ArgumentParser, ctx: int) -> None:
    """The model and context flags of the tools that run a session (``-m``, ``--ctx``, ``-b``,
    ``-t``, ``--cache-mb``); ``args.model`` is None for the built-in tiny model."""
    p.add_argument("-m", "--model", type=Path, default=None, help="GGUF (default: the built-in tiny model)")
    p.add_argument("--ctx", type=int, default=ctx)
    p.add_argument(
        "-b",
        "--batch",
        type=parse_batch,
        default=512,
        help="n_batch = n_ubatch (default 512); auto: streamed, sized from the memory room as bmoe.cli "
        "--moe-stream does without -b (the stock modes keep 512)",
    )
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument(
        "--cache-mb", type=int, default=None, help="stream the experts with this cache (default: resident)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    session_flags(p, ctx=16384)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma separated, of {', '.join(MODES)}")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=3000)
    p.add_argument("--tool-tokens", type=int, default=200)
    p.add_argument("--gen", type=int, default=64)
    args = p.parse_args()
    args.model = args.model or default_model_path()
    import llama_cpp
    from llama_cpp import _internals

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True  # the tokenizer only: the model may be larger than the memory
    vocab = _internals.LlamaModel(path_model=str(args.model), params=params, verbose=False)

    def tokenize(text: str) -> list[int]:
        return list(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    system = "You are a coding agent. Tools:\n" + filler(args.system_tokens, tokenize, 0)
    tools = [filler(args.tool_tokens, tokenize, 1000 * (k + 1)) for k in range(2 * args.turns)]
    vocab.close()  # type: ignore[no-untyped-call]
    rows: list[Turn] = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}: {', '.join(MODES)}")
        rows += run_mode(mode, args, system, tools)
    how = "resident" if args.cache_mb is None else f"streamed, cache {args.cache_mb} MiB"
    print(
        f"model {args.model.name}, {how}, system {args.system_tokens} tokens, tool results "
        f"{args.tool_tokens}, {args.gen} generated, -b {args.batch}\n"
    )
    print(
        "| mode | conversation | turn | prompt tokens | prefilled | restored | MiB read | first token s "
        "| prefill alone s | ratio |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        alone = f"{r.prefill_s:.3f}" if r.prefill_s >= 0 else "-"
        ratio = f"{r.first_token_s / r.prefill_s:.2f}" if r.prefill_s > 0 else "-"
        print(
            f"| {r.mode} | {r.who} | {r.turn} | {r.prompt_tokens} | {r.prefilled} | {r.restored} | "
            f"{r.read_mib:.1f} | {r.first_token_s:.3f} | {alone} | {ratio} |"
        )


if __name__ == "__main__":
    main()
