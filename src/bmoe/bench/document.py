"""The run's two documents: ``bench.md`` (the section docs/benchmarks.md takes as it is)
and ``bench.json`` (every figure, every round)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from bmoe.bench import report, report_markdown, step_report
from bmoe.bench.disk import MIB, Bandwidth
from bmoe.bench.io_group import DiskThrottle
from bmoe.bench.prefill import PREFILL_BATCH


@attrs.frozen
class RunFacts:
    """How the run was made: the command, the machine, the disk, the prefill's and the
    decode's settings, and the configurations skipped (``{key: reason}``)."""

    command: str
    model: Path
    facts: dict[str, Any]
    sequential: Bandwidth
    lanes: Bandwidth
    expert_bytes: int
    warmup: int
    tokens: int
    threads: int
    io_threads: int
    n_ctx: int
    rounds: int
    mem_limit_mb: int
    throttle: DiskThrottle = attrs.field(factory=DiskThrottle)
    prompt_tokens: int = 0
    batch: int | str = PREFILL_BATCH  # --batch-size: the prompt's batch, or "auto"
    text_source: str = "the built-in English text"
    skipped: dict[str, str] = attrs.field(factory=dict)
    parallel: tuple[int, ...] = ()  # --parallel's sequence counts (() : one sequence)


def disk_text(seq: Bandwidth, lanes: Bandwidth, throttle: DiskThrottle | None = None) -> str:
    how = "O_DIRECT" if seq.odirect else "buffered (the filesystem refused O_DIRECT)"
    held = ""
    if throttle is not None and throttle.active:
        ceiling = "; the disk ceiling below is the throttle" if throttle.mib_s else ""
        held = f"throttled by an I/O cgroup to {throttle.text()} (a phone's flash){ceiling}; read inside it: "
    return (
        f"{held}{seq.mib_s:,.0f} MiB/s sequential, one 4 MiB read in flight; {lanes.mib_s:,.0f} MiB/s with "
        f"{lanes.lanes} reads in flight ({how}, {seq.bytes / MIB:,.0f} MiB of the model file read after "
        "dropping it from the page cache)"
    )


def prefill_text(prompt_tokens: int, batch: int | str = PREFILL_BATCH) -> str:
    """The report's sentence on the prefill ("" when none was measured)."""
    if not prompt_tokens:
        return ""
    if isinstance(batch, int):
        how = f"n_batch = n_ubatch = {batch} everywhere"
    else:
        how = (
            f"n_batch = n_ubatch = {PREFILL_BATCH}; the streamed configurations sized theirs from the "
            "memory room, `--batch-size auto`: the prompt batch column"
        )
    calls = "one `llama_decode`" if isinstance(batch, int) and prompt_tokens <= batch else "batches"
    return (
        f"Prefill: the text's first {prompt_tokens} tokens in {calls} ({how}), timed, after the load "
        "and before the decode. "
    )


def markdown(
    run: RunFacts,
    outcome: report.Outcome,
    *,
    title: str,
    chart: Path | None,
    sections: list[str] | None = None,
    after: list[str] | None = None,
) -> str:
    """The report; ``sections``: lines put before the configurations' table (``--parallel``'s),
    ``after``: lines after its list (the streamed step's account, ``step_report``)."""
    f = run.facts
    limit = f", inside a memory cgroup of {run.mem_limit_mb} MiB" if run.mem_limit_mb else ""
    size = run.model.stat().st_size
    decode_from = f" from position {run.prompt_tokens} on" if run.prompt_tokens else ""
    lines = [
        f"## {title} ({time.strftime('%Y-%m-%d')})",
        "",
        "```sh",
        run.command,
        "```",
        "",
        f"Machine: {f['nproc']} CPUs ({f['cpu']}), MemTotal {f['mem_total_gib']:.1f} GiB, kernel "
        f"{f['kernel']}, llama-cpp-python {f['llama_cpp_python']}, model {size / 1e9:.2f} GB (routed "
        f"experts {run.expert_bytes / MIB:,.0f} MiB) on {f['filesystem']}. Disk, measured in the same "
        f"run: {disk_text(run.sequential, run.lanes, run.throttle)}.",
        "",
        f"{prefill_text(run.prompt_tokens, run.batch)}Decode: teacher forcing over {run.text_source}"
        f"{decode_from}, {run.warmup} warm-up tokens then {run.tokens} measured, one token per "
        f"`llama_decode`, {run.threads} compute threads, {run.io_threads} read lanes, flash attention "
        f"off everywhere, n_ctx {run.n_ctx}{_per_sequence(run)}, {run.rounds} interleaved rounds, each "
        "configuration in a "
        f"fresh process after dropping the model from the page cache{limit}"
        + (f", its reads of the disk held to {run.throttle.text()}" if run.throttle.active else "")
        + ".",
        "",
        *(sections or []),
        report_markdown.markdown_table(outcome.summaries, outcome.baseline),
        "",
        report_markdown.LEGEND,
        "",
        *report_markdown.summary_lines(
            outcome.summaries, outcome.checks, outcome.routing, run.rounds, outcome.baseline
        ),
        "",
        *(after or []),
    ]
    if chart is not None:
        lines += [f"![tok/s against the cache budget]({chart.name})", ""]
    return "\n".join(lines)


def _per_sequence(run: RunFacts) -> str:
    if not run.parallel:
        return ""
    counts = ", ".join(str(n) for n in run.parallel)
    return f" per sequence, at {counts} sequences decoded together (prompts prefilled one by one)"


def payload(
    run: RunFacts,
    outcome: report.Outcome,
    runs: dict[str, list[dict[str, Any]]],
    *,
    wall_s: float,
    steps: Sequence[step_report.StepRow] = (),
) -> dict[str, Any]:
    return {
        "command": run.command,
        "model": str(run.model),
        "facts": run.facts,
        "bandwidth": {
            "sequential": attrs.asdict(run.sequential) | {"mib_s": run.sequential.mib_s},
            "lanes": attrs.asdict(run.lanes) | {"mib_s": run.lanes.mib_s},
        },
        "expert_bytes": run.expert_bytes,
        "mem_limit_mb": run.mem_limit_mb,
        "disk_throttle": attrs.asdict(run.throttle),
        "n_ctx": run.n_ctx,
        "parallel": list(run.parallel),
        "prompt_tokens": run.prompt_tokens,
        "batch": run.batch,
        "text": run.text_source,
        "skipped": run.skipped,
        "prefill_baseline": attrs.asdict(baseline := outcome.baseline) | {"text": baseline.text()},
        "summaries": [attrs.asdict(s) for s in outcome.summaries],
        "token_checks": [
            attrs.asdict(t) | {"equal": t.equal, "required": t.required} for t in outcome.checks
        ],
        "routing": attrs.asdict(routing := outcome.routing) | {"text": routing.text()},
        "steps": [attrs.asdict(row) for row in steps],
        "runs": runs,
        "wall_s": wall_s,
    }
