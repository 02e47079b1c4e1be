"""The command line of ``python -m bmoe.bench``: every flag, its default and its help
(:func:`parser`). What the flags mean together is :mod:`~bmoe.bench.run_plan`'s."""

from __future__ import annotations

import argparse
from pathlib import Path

from bmoe.bench import configs as cf
from bmoe.bench.prefill import AUTO_BATCH, DEFAULT_PROMPT_TOKENS, PREFILL_BATCH

DEFAULT_CONFIGS = ",".join(cf.KINDS)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.bench",
        description=(
            "Benchmark bmoe (resident, and streaming at several cache budgets) against stock "
            "llama-cpp-python on one model: a timed prefill of the prompt, then a teacher-forced "
            "decode, optionally under a memory limit."
        ),
    )
    model = p.add_mutually_exclusive_group()
    model.add_argument("-m", "--model", type=Path, help="a GGUF model (default: the synthetic bench model)")
    model.add_argument(
        "--size-gb",
        type=float,
        default=5.6,
        help="size of the synthetic bench model to make (and cache) when no -m is given (default 5.6)",
    )
    p.add_argument(
        "--model-kind",
        choices=("synthetic", "trained"),
        default="synthetic",
        help="without -m: the synthetic bench model (random weights, made and cached at --size-gb; the "
        "default), or the trained one (routing learned on text, experts padded to the synthetic's size: "
        "made once by python -m bmoe.bench.trained --bench, docs/trained-model.md)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the bench model")
    p.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"configurations to run, comma separated, from {DEFAULT_CONFIGS} (default: all)",
    )
    p.add_argument(
        "--budgets",
        default="0,25%,50%",
        help="streaming cache budgets: MiB (1536), a share of the experts (25%%), 0 = cache off, auto "
        "(--cache-mb auto, the default of bmoe's commands: sized from the memory room); 25%% is always "
        "added (the routing check). Default 0,25%%,50%%",
    )
    p.add_argument(
        "--prefetch",
        default="",
        help="also run each cache budget with --prefetch K for these depths (e.g. 1,2; default: none)",
    )
    p.add_argument(
        "--policies",
        default="",
        help="also run each cache budget asked for (not the routing probe's 25%% added beside them) with "
        "these decode routing policies, comma separated: prefetch=K, predict, predict-auto, "
        "predict-spec=N, predict-depth=N, route-ahead=N, drop=F, substitute=L (e.g. "
        "predict,route-ahead=2,drop=0.75; docs/read-ahead.md), or the cache's eviction: lfu, "
        "lfu-half=N (--cache-policy lfu --cache-half-life N), slru, lru, adaptive (default: none)",
    )
    p.add_argument(
        "--parallel",
        "-np",
        default="",
        help="run every configuration at these sequence counts (e.g. 1,2,4,8): each decode step is one "
        "llama_decode holding one token of every sequence, each fed its own part of the text; reports "
        "aggregate and per-sequence tok/s and MiB read per generated token (default: one sequence, "
        "the plain bench)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds over the configurations (median)"
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=DEFAULT_PROMPT_TOKENS,
        help=f"prefill this many tokens of the text, timed, before the decode, which continues after "
        f"them (beyond the built-in text, held-out text of the machine's corpus follows it; 0: no "
        f"prefill measure; default {DEFAULT_PROMPT_TOKENS})",
    )
    p.add_argument(
        "-b",
        "--batch-size",
        default=str(PREFILL_BATCH),
        help=f"the prompt's batch (n_batch = n_ubatch) in every configuration (default {PREFILL_BATCH}, "
        f"llama-cpp-python's Llama default); {AUTO_BATCH}: bmoe's streamed configurations size it from "
        f"the memory room as bmoe.cli --moe-stream does without -b, the others keep {PREFILL_BATCH}",
    )
    p.add_argument("--warmup", type=int, default=16, help="fed tokens before the measure")
    p.add_argument("--tokens", type=int, default=64, help="fed tokens measured")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp compute threads")
    p.add_argument("--io-threads", type=int, default=4, help="bmoe's read lanes")
    p.add_argument(
        "--no-repack",
        action="store_true",
        help="bmoe's configurations keep the weights in the file's layout (compared with stock-norepack); "
        "by default they repack as stock llama.cpp does (compared with stock)",
    )
    p.add_argument(
        "--ctx",
        type=int,
        default=0,
        help="context length (default: prompt-tokens + warmup + tokens, at least 256)",
    )
    p.add_argument(
        "--mem-limit-mb",
        type=int,
        default=0,
        help="run each configuration in a memory cgroup of N MiB; stock (weights repacked into "
        "anonymous memory at load) is skipped, saying so, when the model file is larger than N MiB",
    )
    p.add_argument(
        "--disk-mib-s",
        type=int,
        default=0,
        help="emulate a phone's flash: run every configuration (stock too) and the disk probes in an "
        "I/O cgroup that holds reads of the model's disk to N MiB/s; the report's disk ceiling is then N "
        "(default 0: the disk as it is)",
    )
    p.add_argument(
        "--disk-iops",
        type=int,
        default=0,
        help="with or without --disk-mib-s: hold reads of the model's disk to N a second "
        "(default 0: no limit)",
    )
    p.add_argument(
        "--bw-max-mib",
        type=int,
        default=2048,
        help="read at most this much for the bandwidth (0: the whole file)",
    )
    p.add_argument(
        "--probe-mib",
        type=int,
        default=256,
        help="random O_DIRECT reads (MiB) before each streamed round, for its disk ceiling (0: off)",
    )
    p.add_argument("--max-seconds", type=float, default=300.0, help="cap on each warm-up and each measure")
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="kill a configuration's process after this long"
    )
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for bench.json/md/png")
    p.add_argument("--title", default="", help="title of the report and the chart")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument(
        "--plan",
        action="store_true",
        help="print python -m bmoe.plan's prediction beside each streamed configuration's measure",
    )
    p.add_argument(
        "--draft",
        choices=("off", "copy"),
        default="off",
        help="copy: measure copy drafts instead (acceptance, a verify batch's reads, and an agent-edit "
        "transcript and plain prose streamed with drafts off and on: docs/benchmarks.md)",
    )
    p.add_argument(
        "--no-routing-check",
        action="store_true",
        help="run only the budgets asked for: no 25%% budget added to check that the routing moves "
        "(python -m bmoe.plan --verify runs so)",
    )
    p.add_argument(
        "--find-cache-mb",
        action="store_true",
        help="with --mem-limit-mb: instead of the rounds, find the largest --cache-mb that runs in "
        "that limit through a long prompt (--prompt-tokens; 2048 where left at its default) and a "
        "decode, beside the budget --cache-mb auto takes there (bisection, one process a try)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p
