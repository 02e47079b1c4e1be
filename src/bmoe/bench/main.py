"""``python -m bmoe.bench``: bmoe against stock llama-cpp-python, in one command.

One run: the model (``-m``, or the synthetic bench model at ``--size-gb``, made once and
cached), the disk's ``O_DIRECT`` bandwidth measured on it, then every configuration in its
own process after the model file is dropped from the page cache, optionally inside a memory
cgroup (``--mem-limit-mb``), all fed the same text: its first ``--prompt-tokens`` in one
timed prefill (in batches of ``--batch-size``), then token by token, in interleaved rounds.
Under a memory limit smaller than the model file, ``stock`` (which repacks the weights into
anonymous memory at load) is said up front and skipped (:mod:`~bmoe.bench.memory_fit`).
Writes ``bench.json``, ``bench.md`` and ``bench.png`` into ``--out``; the Markdown also goes
to stdout, progress to stderr. Exit status 1 when a bmoe configuration failed or bmoe's
greedy tokens differ from stock's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from bmoe.bench import configs as cf
from bmoe.bench import document, report
from bmoe.bench.cgroup import CgroupError, MemoryGroup, machine_sites
from bmoe.bench.checks import TokenCheck
from bmoe.bench.disk import MIB, Bandwidth
from bmoe.bench.io_group import Confinement, DiskThrottle, IoGroup, block_device_of
from bmoe.bench.memory_fit import skipped_configs
from bmoe.bench.prefill import AUTO_BATCH, DEFAULT_PROMPT_TOKENS, PREFILL_BATCH
from bmoe.bench.progress import make_progress
from bmoe.bench.text import TEXT

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
        help="streaming cache budgets: MiB (1536), a share of the experts (25%%), 0 = cache off; "
        "25%% is always added (the routing check). Default 0,25%%,50%%",
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
        "lfu-half=N (--cache-policy lfu --cache-half-life N; default: none)",
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
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


@attrs.frozen
class Plan:
    """The validated arguments."""

    kinds: list[str]
    budgets: list[cf.Budget]
    n_ctx: int
    fed: int  # tokens of the text each configuration takes: prompt, warm-up, measure
    prefetch: tuple[int, ...] = ()
    policies: tuple[cf.Policy, ...] = ()
    parallel: tuple[int, ...] = ()  # sequence counts (--parallel); () : the plain bench
    batch: int | str = PREFILL_BATCH  # the prompt's batch, or AUTO_BATCH (streamed: from the room)

    @property
    def text_tokens(self) -> int:
        """Tokens of text the run needs: each sequence's fed tokens (``--parallel``'s widest)."""
        return self.fed * max(self.parallel or (1,))

    def n_ctx_for(self, config: cf.BenchConfig) -> int:
        """The context of one configuration: several sequences share one KV cache, each
        holding its fed tokens."""
        n = config.parallel or 1
        return self.n_ctx if n == 1 else max(self.n_ctx, -(-n * self.fed // 256) * 256)


def make_plan(args: argparse.Namespace, n_text_tokens: int | None = None) -> Plan:
    """Check the arguments together; ``BenchConfigError`` says what is wrong."""
    kinds = cf.parse_kinds(args.configs)
    budgets = cf.parse_budgets(args.budgets)
    if args.warmup < 0 or args.tokens < 1:
        raise cf.BenchConfigError("need --warmup >= 0 and --tokens >= 1")
    if args.rounds < 1:
        raise cf.BenchConfigError("need --rounds >= 1")
    if args.mem_limit_mb < 0:
        raise cf.BenchConfigError("--mem-limit-mb must be >= 0")
    if args.disk_mib_s < 0 or args.disk_iops < 0:
        raise cf.BenchConfigError("--disk-mib-s and --disk-iops must be >= 0")
    if args.prompt_tokens < 0:
        raise cf.BenchConfigError(f"--prompt-tokens must be >= 0, not {args.prompt_tokens}")
    batch = parse_batch(args.batch_size)
    fed = args.prompt_tokens + args.warmup + args.tokens
    if n_text_tokens is not None and fed > n_text_tokens:
        raise cf.BenchConfigError(
            f"--prompt-tokens + --warmup + --tokens = {fed}, the text holds {n_text_tokens} tokens"
        )
    n_ctx = args.ctx or max(256, fed)
    if n_ctx < fed:
        raise cf.BenchConfigError(
            f"--ctx {n_ctx} cannot hold {fed} fed tokens (--prompt-tokens + --warmup + --tokens)"
        )
    parallel = cf.parse_parallel(args.parallel) if args.parallel.strip() else ()
    policies = cf.parse_policies(args.policies)
    prefetch = cf.parse_prefetch(args.prefetch)
    routing = [pol for pol in policies if pol.name not in cf.CACHE_RULES]
    if parallel and max(parallel) > 1 and (routing or prefetch):
        raise cf.BenchConfigError(
            "--parallel above 1 does not combine with --policies or --prefetch (routing policies "
            "follow one sequence)"
        )
    if parallel and n_text_tokens is not None:
        cf.sequence_texts(list(range(n_text_tokens)), 1, max(parallel), fed)  # refuses a short text
    return Plan(
        kinds=kinds,
        budgets=budgets,
        n_ctx=n_ctx,
        fed=fed,
        prefetch=prefetch,
        policies=policies,
        parallel=parallel,
        batch=batch,
    )


def parse_batch(text: str) -> int | str:
    """``--batch-size``: a count of tokens (at least 1), or ``auto``."""
    if text.strip() == AUTO_BATCH:
        return AUTO_BATCH
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise cf.BenchConfigError(f"--batch-size is a number of tokens (>= 1) or {AUTO_BATCH}, not {text!r}")
    return n


def fed_text(model: Path, needed: int) -> tuple[list[int], str]:
    """The tokens every configuration is fed and what text they are: the built-in text, or,
    where a run needs more tokens than it holds (a long prompt), the built-in text followed
    by held-out text of the machine's corpus (``bmoe.bench.trained.corpus``: the Python
    standard library's docstrings and /usr/share/doc)."""
    from bmoe.bench.model import tokenize

    tokens = tokenize(model, TEXT)
    if len(tokens) >= needed:
        return tokens, "the built-in English text"
    from bmoe.bench.trained.corpus import machine_corpus

    held_out = machine_corpus().held_out
    return tokenize(model, TEXT + "\n\n" + held_out), "the built-in English text, then held-out corpus text"


def _resolve_model(args: argparse.Namespace) -> Path:
    if args.model is not None:
        path = Path(args.model).resolve()
        if not path.is_file():
            raise cf.BenchConfigError(f"no such model file: {path}")
        return path
    if args.model_kind == "trained":
        return trained_bench_model(args.seed)
    from bmoe.bench.model import cached_bench_model, shape_for_size

    shape = shape_for_size(args.size_gb)
    return cached_bench_model(shape, args.seed)


def trained_bench_model(seed: int) -> Path:
    """The cached bench-scale trained model; ``BenchConfigError`` with the command that makes
    it (40 minutes of training) when there is none yet."""
    from bmoe.bench.trained.layout import TrainedDims
    from bmoe.bench.trained.main import BENCH_DIMS, cached_trained_path
    from bmoe.bench.trained.padded import bench_width

    dims: TrainedDims = BENCH_DIMS
    path = cached_trained_path(dims, seed, bench_width(dims.n_embd))
    if not path.is_file():
        raise cf.BenchConfigError(
            f"no trained bench model at {path}: make it once with "
            f"python -m bmoe.bench.trained --bench --seed {seed} --out DIR "
            "(torch, about 45 minutes on 2 cores)"
        )
    return path


def _file_name(key: str) -> str:
    """A configuration's key as a file name (anything but letters, digits, ``.=-`` to ``_``)."""
    return re.sub(r"[^\w.=-]", "_", key)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.child:
        from bmoe.bench import child

        return child.main()
    try:
        make_plan(args)
        model = _resolve_model(args)
    except (cf.BenchConfigError, ValueError) as exc:
        p.error(str(exc))
    # a SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so the memory group is removed
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.draft == "copy":
        from bmoe.bench.drafts import run_drafts

        return run_drafts(args, model, list(argv) if argv is not None else sys.argv[1:])
    return run_bench(args, model, list(argv) if argv is not None else sys.argv[1:])


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_bench(args: argparse.Namespace, model: Path, argv: list[str]) -> int:
    from bmoe.bench.model import expert_bytes
    from bmoe.bench.procfs import machine_facts
    from bmoe.bench.runner import probe_disk, run_configuration

    tokens, text_source = fed_text(model, make_plan(args).text_tokens)
    plan = make_plan(args, len(tokens))
    throttle = DiskThrottle(args.disk_mib_s, args.disk_iops)
    try:
        make_group = confinement_factory(model, args.mem_limit_mb, throttle)
        make_probe_group = confinement_factory(model, 0, throttle)
        if make_group is not None:
            make_group().close()  # refuse now, before measuring anything, if none is writable
    except CgroupError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    experts = expert_bytes(model)
    configs = cf.build_configs(plan.kinds, plan.budgets, experts, plan.prefetch, plan.policies)
    if plan.parallel:
        configs = cf.with_parallel(configs, plan.parallel)
    skipped = skipped_configs(
        configs, model.stat().st_size, args.mem_limit_mb, bmoe_repack=not args.no_repack
    )
    for key, reason in skipped.items():
        print(f"bench: {key}: skipped: {reason}", file=sys.stderr)
    schedule = cf.interleave([c for c in configs if c.key not in skipped], args.rounds)
    for c in configs:
        if args.mem_limit_mb and c.cache_mib and c.cache_mib >= args.mem_limit_mb:
            print(
                f"bench: warning: {c.label} does not fit the memory limit of {args.mem_limit_mb} MiB",
                file=sys.stderr,
            )

    facts = machine_facts(model)
    print(
        f"bench: {model} ({model.stat().st_size / 1e9:.2f} GB, experts {experts / MIB:,.0f} MiB)",
        file=sys.stderr,
    )
    seq = probe_disk(model, "sequential", args.bw_max_mib, 1, make_group=make_probe_group)
    lanes = seq
    if args.io_threads > 1:
        lanes = probe_disk(model, "sequential", args.bw_max_mib, args.io_threads, make_group=make_probe_group)
    print(f"bench: disk: {document.disk_text(seq, lanes, throttle)}", file=sys.stderr)
    for warning in throttle_warnings(throttle, [seq, lanes]):
        print(f"bench: warning: {warning}", file=sys.stderr)
    ceiling_mib_s = float(throttle.mib_s) if throttle.mib_s else seq.mib_s

    fed = plan.fed
    progress = make_progress(sum(fed * (c.parallel or 1) for _, c in schedule))
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    t0 = time.perf_counter()
    probes = 0
    try:
        for round_no, config in schedule:
            spec = {
                "key": config.key,
                "kind": config.kind,
                "cache_mib": config.cache_mib,
                "routing": config.stream_kwargs(),
                "model": str(model),
                "tokens": tokens[:fed],
                "prompt_tokens": args.prompt_tokens,
                "batch": plan.batch,
                "warmup": args.warmup,
                "measure": args.tokens,
                "n_ctx": plan.n_ctx_for(config),
                "threads": args.threads,
                "io_threads": args.io_threads,
                "repack": not args.no_repack,
                "max_seconds": args.max_seconds,
            }
            if config.parallel is not None:
                texts = cf.sequence_texts(tokens, config.parallel, max(plan.parallel), fed)
                spec |= {"parallel": config.parallel, "texts": texts}
            probe = None
            if config.kind == "stream" and args.probe_mib > 0:
                probes += 1  # a new seed each time: a block read again may come from the host's cache
                probe = probe_disk(
                    model, "random", args.probe_mib, args.io_threads, seed=probes, make_group=make_probe_group
                )
            progress.begin(
                f"round {round_no + 1}/{args.rounds}: {config.label}", fed * (config.parallel or 1)
            )
            r = run_configuration(
                spec,
                model=model,
                make_group=make_group,
                timeout_s=args.timeout,
                on_progress=progress.update,
                log_path=args.out / "logs" / f"{_file_name(config.key)}-round{round_no + 1}.log",
            )
            r["round"] = round_no
            if probe is not None:
                r["probe_mib_s"] = probe.mib_s
            runs[config.key].append(r)
            if "error" in r:
                progress.end(f"{config.label}: failed: {r['error']}")
            else:
                progress.end(f"{config.label}: {finished_text(r)}")
    finally:
        progress.close()
    if args.plan:
        from bmoe.bench.plan_check import prediction_lines

        n_ctx = {c.key: plan.n_ctx_for(c) for c in configs}
        for line in prediction_lines(
            model,
            configs,
            runs,
            n_ctx=n_ctx,
            prompt_tokens=args.prompt_tokens,
            mem_limit_mb=args.mem_limit_mb,
            disk_mib_s=ceiling_mib_s,
        ):
            print(line, file=sys.stderr)

    if plan.parallel:
        from bmoe.bench import parallel_report

        outcome = parallel_report.conclude(
            configs, runs, experts, ceiling_mib_s, skipped, repack=not args.no_repack
        )
        sections = [
            "### Sequences decoded together",
            "",
            parallel_report.markdown_table(parallel_report.rows(configs, outcome, runs)),
            "",
            parallel_report.LEGEND,
            "",
            *parallel_report.seq0_lines(configs, runs),
            "",
            "### Every configuration at every count",
        ]
    else:
        outcome = report.conclude(configs, runs, experts, ceiling_mib_s, skipped, repack=not args.no_repack)
        sections = []
    title = args.title or f"{model.name}" + (
        f", memory limit {args.mem_limit_mb} MiB" if args.mem_limit_mb else ""
    ) + (f", disk {throttle.text()}" if throttle.active else "")
    args.out.mkdir(parents=True, exist_ok=True)
    chart = None
    if not args.no_chart and plan.parallel:
        print("bench: no chart with --parallel (the tables say it)", file=sys.stderr)
    elif not args.no_chart:
        from bmoe.bench.chart import ChartUnavailable, draw

        try:
            chart = draw(
                outcome.summaries, args.out / "bench.png", title=title, bandwidth_mib_s=ceiling_mib_s
            )
        except ChartUnavailable as exc:
            print(f"bench: {exc}", file=sys.stderr)
    run = document.RunFacts(
        command=shlex.join(["python", "-m", "bmoe.bench", *argv]),
        model=model,
        facts=facts,
        sequential=seq,
        lanes=lanes,
        expert_bytes=experts,
        warmup=args.warmup,
        tokens=args.tokens,
        threads=args.threads,
        io_threads=args.io_threads,
        n_ctx=plan.n_ctx,
        rounds=args.rounds,
        mem_limit_mb=args.mem_limit_mb,
        throttle=throttle,
        prompt_tokens=args.prompt_tokens,
        batch=plan.batch,
        text_source=text_source,
        skipped=skipped,
        parallel=plan.parallel,
    )
    md = document.markdown(run, outcome, title=title, chart=chart, sections=sections)
    (args.out / "bench.md").write_text(md)
    payload = document.payload(run, outcome, runs, wall_s=time.perf_counter() - t0)
    (args.out / "bench.json").write_text(json.dumps(payload, indent=1))
    print(md)
    print(
        f"bench: wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}" + (f", {chart}" if chart else ""),
        file=sys.stderr,
    )
    return exit_status(outcome.summaries, outcome.checks)


def confinement_factory(
    model: Path, mem_limit_mb: int, throttle: DiskThrottle
) -> Callable[[], Confinement] | None:
    """What makes one process's groups: a memory group of ``mem_limit_mb`` MiB and/or a
    disk throttle on the model's disk; None when neither is asked for. ``CgroupError``
    now where the model is on no block device; a group that cannot be made refuses when
    first made."""
    if not mem_limit_mb and not throttle.active:
        return None
    device = block_device_of(model) if throttle.active else None
    memory_sites = machine_sites()
    io_sites = machine_sites("blkio")
    name = f"bmoe-bench-{os.getpid()}"

    def make() -> Confinement:
        groups = Confinement()
        try:
            if mem_limit_mb:
                groups.memory = MemoryGroup.create(memory_sites, name, mem_limit_mb * MIB)
            if device is not None:
                groups.io = IoGroup.create(io_sites, name + "-io", device, throttle, inside=groups.memory)
        except CgroupError:
            groups.close()
            raise
        return groups

    return make


def throttle_warnings(throttle: DiskThrottle, measured: Sequence[Bandwidth]) -> list[str]:
    """Where a probe inside the throttle read faster than it (by more than 10%): the
    throttle did not take, and the ceiling the report uses is not the disk's."""
    if not throttle.mib_s:
        return []
    return [
        f"the disk probe read {bw.mib_s:,.0f} MiB/s on {bw.lanes} lane(s) inside a throttle of "
        f"{throttle.mib_s:,} MiB/s: the throttle did not take (another device? a buffered filesystem?)"
        for bw in measured
        if bw.mib_s > 1.1 * throttle.mib_s
    ]


def finished_text(result: dict[str, Any]) -> str:
    """A finished round's progress line: its prefill (if measured) and its decode."""
    decode = f"decode {result['tok_s']:.2f} tok/s over {result['measured_tokens']} tokens"
    if result.get("prefill_tok_s") is None:
        return decode
    prefill = f"prefill {result['prefill_tok_s']:.2f} tok/s over {result['prompt_tokens']} tokens"
    if result.get("prefill_ubatch"):
        prefill += f" in batches of {result['prefill_ubatch']}"
    return f"{prefill}, {decode}"


def exit_status(summaries: Sequence[report.Summary], checks: Sequence[TokenCheck]) -> int:
    """1 when a bmoe configuration failed or its greedy tokens differ from stock's (where both
    prefilled the prompt in batches of one size: ``TokenCheck.required``). A stock
    configuration that fails (its repacked weights OOM-killed under a memory limit, say) or is
    skipped is a finding the report shows, not a failure of the bench."""
    tokens_ok = all(t.equal or not t.required for t in checks if not t.key.startswith("stock"))
    bmoe_ok = all(s.ok for s in summaries if not s.kind.startswith("stock"))
    return 0 if tokens_ok and bmoe_ok else 1
