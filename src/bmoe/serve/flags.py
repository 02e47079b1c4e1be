"""The server's command line: the CLI's model, context and streaming flags, plus its own.

The flags that open the session are spelled, defaulted and read as ``python -m bmoe.cli``'s
(a test holds the two to the same ``SessionConfig``); sampling flags are the defaults for
requests that leave a setting unsaid; the server always renders chat requests through the
model's chat template (there is no ``--chatml``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bmoe.adapters.llama import ContextParams
from bmoe.domain.decide import PREFIX_CACHE_MODES, DecideConfig
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import STREAM_POLICIES, StreamConfig, prompt_batch
from bmoe.runtime import SessionConfig
from bmoe.serve.mapping import ServeDefaults


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.serve",
        description="Serve a Mixture-of-Experts GGUF model over an OpenAI-compatible HTTP API "
        "(docs/server.md).",
        epilog="With no -m, the built-in tiny random-weight model (qwen3moe) is served: its text is "
        "gibberish, but every endpoint works.",
    )
    p.add_argument("-m", "--model", type=Path, help="GGUF file (for a split model: the first shard)")
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
    p.add_argument("-t", "--threads", type=int, default=2, help="compute threads (default: 2)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="context length (default: 512)")
    p.add_argument(
        "-b",
        "--batch-size",
        type=int,
        default=None,
        help="prompt batch and ubatch size (default: 64; 512 with --moe-stream, at most -c)",
    )
    p.add_argument("--no-think", action="store_true", help="render chat turns with thinking off by default")
    p.add_argument("--seed", type=int, default=0, help="default sampling seed (default: 0)")
    p.add_argument("--temp", type=float, default=0.0, help="default temperature; 0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=40, help="default top-k when temperature > 0 (default: 40)")
    p.add_argument(
        "--top-p", type=float, default=0.95, help="default top-p when temperature > 0 (default: 0.95)"
    )
    p.add_argument("--verbose", action="store_true", help="show llama.cpp's log on stderr")
    p.add_argument(
        "--n-expert-used",
        type=int,
        default=None,
        metavar="K",
        help="run a MoE model with K experts per token instead of its own top-k (lossy; 1..n_expert)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: info: one access line per request)",
    )
    m = p.add_argument_group("expert streaming (docs/streaming.md)")
    m.add_argument("--moe-stream", action="store_true", help="keep experts on flash, read them when routed")
    m.add_argument(
        "--cache-mb",
        type=_cache_mb,
        default=None,
        metavar="N|auto",
        help="expert cache budget in MiB; 0 = cache off; auto (default) = available memory minus 1 GiB",
    )
    m.add_argument(
        "--cache-ceil-mb", type=int, default=None, metavar="N", help="upper bound for --cache-mb auto"
    )
    m.add_argument("--io-threads", type=int, default=4, metavar="N", help="read lanes (default: 4)")
    m.add_argument("--no-odirect", action="store_true", help="buffered reads instead of O_DIRECT")
    m.add_argument(
        "--stream-policy",
        choices=STREAM_POLICIES,
        default="fast",
        help="fast (default: the C engine) or reference (the Python policy; slow, identical output)",
    )
    m.add_argument(
        "--prefetch",
        type=int,
        default=0,
        metavar="K",
        help="in decode, read ahead the next K MoE layers' experts as the previous token routed them "
        "(lossless; needs the cache; default: 0 = off)",
    )
    m.add_argument(
        "--no-prefill-ahead",
        action="store_true",
        help="in a prefill batch that routes most of a layer's experts, do not read the whole next "
        "layer ahead (default: read it ahead, behind the compute)",
    )
    d = p.add_argument_group("decisions (docs/decide.md)")
    d.add_argument("--decide", action="store_true", help="accept POST /v1/decide")
    d.add_argument(
        "--decide-prefix-cache",
        choices=PREFIX_CACHE_MODES,
        default="auto",
        help="keep the state after a decision's prefix: auto (default), on, off",
    )
    d.add_argument(
        "--decide-prefix-slots",
        type=int,
        default=1,
        metavar="K",
        help="keep the prefix states of the K most recent prefixes (default: 1)",
    )
    return p


def _cache_mb(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB or 'auto', not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("the cache budget cannot be negative")
    return value


def session_config(args: argparse.Namespace, model_path: Path) -> SessionConfig:
    """The session the server opens (chat mode; decisions when ``--decide``)."""
    batch = prompt_batch(args.batch_size, streaming=args.moe_stream, n_ctx=args.ctx_size)
    return SessionConfig(
        model_path=model_path,
        context=ContextParams(n_ctx=args.ctx_size, n_batch=batch, n_ubatch=batch, n_threads=args.threads),
        chat=True,
        think=not args.no_think,
        verbose=args.verbose,
        n_expert_used=args.n_expert_used,
        decide=DecideConfig(
            enabled=args.decide, prefix_cache=args.decide_prefix_cache, prefix_slots=args.decide_prefix_slots
        ),
        stream=StreamConfig(
            enabled=args.moe_stream,
            cache_mb=args.cache_mb,
            cache_ceil_mb=args.cache_ceil_mb,
            io_threads=args.io_threads,
            odirect=not args.no_odirect,
            policy=args.stream_policy,
            prefetch=args.prefetch,
            prefill_ahead=not args.no_prefill_ahead,
        ),
    )


def serve_defaults(args: argparse.Namespace) -> ServeDefaults:
    """What requests that leave a setting unsaid get."""
    return ServeDefaults(
        sampling=SamplingParams(temp=args.temp, top_k=args.top_k, top_p=args.top_p, seed=args.seed),
        max_tokens=args.max_tokens,
    )


def model_id(args: argparse.Namespace, model_path: Path) -> str:
    """The id ``/v1/models`` lists: ``--alias``, else the file name less ``.gguf``."""
    if args.alias:
        return str(args.alias)
    return model_path.name.removesuffix(".gguf")
