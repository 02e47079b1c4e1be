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
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bmoe.bench import configs as cf
from bmoe.bench import document, report, step_report
from bmoe.bench.arguments import parser
from bmoe.bench.cgroup import CgroupError
from bmoe.bench.checks import TokenCheck
from bmoe.bench.confinement import confinement_factory, throttle_warnings
from bmoe.bench.disk import MIB
from bmoe.bench.io_group import DiskThrottle
from bmoe.bench.largest_cache import FIND_PROMPT_TOKENS, run_find
from bmoe.bench.memory_fit import outside_the_limit, skipped_configs
from bmoe.bench.prefill import DEFAULT_PROMPT_TOKENS
from bmoe.bench.progress import make_progress
from bmoe.bench.run_plan import Plan, make_plan
from bmoe.bench.text import TEXT


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


def fed_plan(args: argparse.Namespace, model: Path) -> tuple[list[int], str, Plan]:
    """The fed tokens, what text they are, and the run's plan checked against them."""
    tokens, text_source = fed_text(model, make_plan(args).text_tokens)
    return tokens, text_source, make_plan(args, len(tokens))


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
    if args.find_cache_mb and args.prompt_tokens == DEFAULT_PROMPT_TOKENS:
        args.prompt_tokens = FIND_PROMPT_TOKENS  # the long prompt the search is about
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
    if args.find_cache_mb:
        return run_find(args, model, find_spec(args, model))
    return run_bench(args, model, list(argv) if argv is not None else sys.argv[1:])


def find_spec(args: argparse.Namespace, model: Path) -> Callable[[int | None], dict[str, Any]]:
    """A streamed try of ``--find-cache-mb`` at a budget (None: auto), as the rounds' specs are."""
    tokens, _, plan = fed_plan(args, model)

    def spec(cache_mib: int | None) -> dict[str, Any]:
        key = "stream-auto" if cache_mib is None else f"stream-{cache_mib}"
        return config_spec(args, model, plan, tokens, cf.BenchConfig(key, key, "stream", cache_mib))

    return spec


def config_spec(
    args: argparse.Namespace, model: Path, plan: Plan, tokens: list[int], config: cf.BenchConfig
) -> dict[str, Any]:
    """What a configuration's child is asked to run (one round)."""
    spec = {
        "key": config.key,
        "kind": config.kind,
        "cache_mib": config.cache_mib,
        "routing": config.stream_kwargs(),
        "model": str(model),
        "tokens": tokens[: plan.fed],
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
        texts = cf.sequence_texts(tokens, config.parallel, max(plan.parallel), plan.fed)
        spec |= {"parallel": config.parallel, "texts": texts}
    return spec


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_bench(args: argparse.Namespace, model: Path, argv: list[str]) -> int:
    from bmoe.bench.model import expert_bytes, expert_read_bytes, written_store
    from bmoe.bench.procfs import machine_facts
    from bmoe.bench.runner import probe_disk, run_configuration

    tokens, text_source, plan = fed_plan(args, model)
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
    configs = cf.build_configs(
        plan.kinds, plan.budgets, experts, plan.prefetch, plan.policies, plan.routing_check
    )
    if plan.parallel:
        configs = cf.with_parallel(configs, plan.parallel)
    skipped = skipped_configs(
        configs, model.stat().st_size, args.mem_limit_mb, bmoe_repack=not args.no_repack
    )
    unconfined = outside_the_limit(configs, skipped)
    for key, reason in skipped.items():
        print(f"bench: {key}: {unconfined.get(key) or f'skipped: {reason}'}", file=sys.stderr)
    skipped = {key: reason for key, reason in skipped.items() if key not in unconfined}
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
    read_size = expert_read_bytes(model)  # what one lane reads: the random probes read that
    store = written_store(model)  # a configuration reading the store is probed on it
    expert_reads = probe_disk(
        model, "random", 256, args.io_threads, block=read_size, make_group=make_probe_group
    )
    print(
        f"bench: disk: {expert_reads.mib_s:,.0f} MiB/s in random {read_size / MIB:.2f} MiB reads on "
        f"{args.io_threads} lanes (an expert's projection: the streamed step's bound)",
        file=sys.stderr,
    )

    fed = plan.fed
    progress = make_progress(sum(fed * (c.parallel or 1) for _, c in schedule))
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    t0 = time.perf_counter()
    probes = 0
    try:
        for round_no, config in schedule:
            spec = config_spec(args, model, plan, tokens, config)
            probe = None
            if config.kind == "stream" and args.probe_mib > 0:
                probes += 1  # a new seed each time: a block read again may come from the host's cache
                reads_store = store is not None and config.stream_kwargs().get("expert_store") != "off"
                probe = probe_disk(
                    store if reads_store and store is not None else model,
                    "random",
                    args.probe_mib,
                    args.io_threads,
                    seed=probes,
                    block=read_size,
                    make_group=make_probe_group,
                )
            progress.begin(
                f"round {round_no + 1}/{args.rounds}: {config.label}", fed * (config.parallel or 1)
            )
            r = run_configuration(
                spec,
                model=model,
                make_group=make_probe_group if config.key in unconfined else make_group,
                timeout_s=args.timeout,
                on_progress=progress.update,
                log_path=args.out / "logs" / f"{_file_name(config.key)}-round{round_no + 1}.log",
            )
            r["round"] = round_no
            if config.key in unconfined:
                r["notes"] = [unconfined[config.key], *r.get("notes", [])]
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
    step_disk = min(float(throttle.mib_s), expert_reads.mib_s) if throttle.mib_s else expert_reads.mib_s
    steps = [] if plan.parallel else step_report.step_rows(configs, runs, step_disk)
    md = document.markdown(
        run, outcome, title=title, chart=chart, sections=sections, after=step_report.markdown(steps)
    )
    (args.out / "bench.md").write_text(md)
    payload = document.payload(run, outcome, runs, wall_s=time.perf_counter() - t0, steps=steps)
    (args.out / "bench.json").write_text(json.dumps(payload, indent=1))
    print(md)
    print(
        f"bench: wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}" + (f", {chart}" if chart else ""),
        file=sys.stderr,
    )
    return exit_status(outcome.summaries, outcome.checks)


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
