"""The report's text: the Markdown table of the configurations (:func:`markdown_table`),
its legend (:data:`LEGEND`), and the list under it of the checks, each configuration's rounds,
prefill reads, notes and failures (:func:`summary_lines`).

Pure: summaries and checks in, text out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from bmoe.bench.checks import RoutingCheck, TokenCheck
from bmoe.bench.report import MIB, StockBaseline, Summary, stock_baseline


def _f(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / MIB:,.0f}"


def _per_tok(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:,.1f}" if v >= 10 or v == 0 else f"{v:.2f}"


def markdown_table(summaries: Sequence[Summary], baseline: StockBaseline | None = None) -> str:
    """One row per configuration; ``baseline`` names the prefill ratio's column (default:
    the one ``stock_baseline`` picks)."""
    baseline = baseline if baseline is not None else stock_baseline(summaries)
    head = [
        "configuration",
        "decode tok/s",
        "median decode step ms",
        "prefill tok/s",
        baseline.column(),
        "prompt batch",
        "prefill reads (x experts)",
        "MiB read/tok (bmoe)",
        "MiB read/tok (kernel)",
        "hit %",
        "stall ms/tok",
        "early reads used %",
        "slot agreement %",
        "slots dropped/substituted %",
        "peak RSS MiB",
        "group peak MiB",
        "x stock",
        "x stock, no repack",
        "of disk ceiling",
        "disk MiB/s next to it",
        "of that ceiling",
        "other CPU load",
    ]
    rows = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for s in summaries:
        if s.skipped is not None:
            cells = [s.label, f"skipped: {s.skipped}"] + [""] * (len(head) - 2)
        elif not s.ok:
            cells = [s.label, f"failed: {'; '.join(dict.fromkeys(s.errors))}"] + [""] * (len(head) - 2)
        else:
            cells = [
                s.label,
                _f(s.tok_s, ".2f"),
                _f(s.step_ms, ".1f"),
                _f(s.prefill_tok_s, ".2f"),
                _f(s.prefill_x_stock, ".2f"),
                "" if s.prefill_ubatch is None else str(s.prefill_ubatch),
                _f(s.prefill_passes, ".2f"),
                _per_tok(s.mib_per_tok),
                _per_tok(s.kernel_mib_per_tok),
                _f(None if s.hit_rate is None else 100 * s.hit_rate, ".1f"),
                _f(s.stall_ms_tok, ".1f"),
                _f(None if s.early_used is None else 100 * s.early_used, ".1f"),
                _f(None if s.agreement is None else 100 * s.agreement, ".1f"),
                _f(None if s.dropped is None else 100 * s.dropped, ".1f"),
                _mib(s.peak_rss_bytes),
                _mib(s.group_peak_bytes),
                _f(s.x_stock, ".2f"),
                _f(s.x_stock_norepack, ".2f"),
                _f(s.of_ceiling, ".2f"),
                _f(s.probe_mib_s, ",.0f"),
                _f(s.of_probe_ceiling, ".2f"),
                _f(s.other_cpu_cores, ".2f"),
            ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


LEGEND = (
    "Decode tok/s: median over the rounds of measured tokens / their decode time; median decode "
    "step: the median of the rounds' median `llama_decode` times. Prefill tok/s: median over the "
    "rounds of the prompt's tokens / the time of the `llama_decode` calls that took them, in "
    "batches of the prompt batch (n_batch = n_ubatch: `--batch-size`, 512 by default; with `auto` "
    "the streamed configurations' own choice), before the decode; prefill x stock: that "
    "over stock's (llama.cpp's defaults, repacking on), or over stock-norepack's where stock has no "
    "figure, as its heading then says. Prefill reads (x experts): the streamed prefill's reads over "
    "the model's routed experts' bytes (1.00: each expert read once). MiB read/tok (bmoe): the "
    "streamer's counters; "
    "(kernel): `/proc/<pid>/io` read_bytes of the configuration's process over the measured tokens, "
    "what the kernel fetched from storage for it (mmap faults and read-ahead included). Hit %: "
    "(layer, expert) lookups found in the cache. Stall: the compute's wait for reads. Early reads used: "
    "reads ahead (prefill's whole next layer, --prefetch, --predict-prefetch, --route-ahead) that a "
    "layer then used. Slot agreement: the stale gate's prediction (or route-ahead's committed "
    "selection) against the router's own. Peak RSS: `VmHWM`, reset once the model was "
    "loaded (prefill and decode). Group peak: the memory group's peak (page cache included). x "
    "stock: decode tok/s over stock llama-cpp-python's. Of disk ceiling: tok/s / (measured O_DIRECT "
    "bandwidth / MiB read per token), the bandwidth measured at the start of the run (sequential), or "
    "the throttle under `--disk-mib-s`. "
    "Disk MiB/s next to it: random O_DIRECT reads (`--probe-mib`, each an expert projection's size, "
    "on the read lanes, of the file the configuration reads: its expert store where one serves) "
    "right before each round of the configuration, median; of that ceiling: per "
    "round, tok/s x MiB read per token / that round's probe, median (this disk's speed moves within "
    "minutes). Other CPU load: CPUs other processes kept busy during the measure (near 1 on a 2-CPU "
    "machine: the row is disturbed)."
)


def _rates(values: Sequence[float | None]) -> str:
    return ", ".join("failed" if v is None else f"{v:.2f}" for v in values)


def summary_lines(
    summaries: Sequence[Summary],
    tokens: Sequence[TokenCheck],
    routing: RoutingCheck,
    rounds: int,
    baseline: StockBaseline | None = None,
) -> list[str]:
    """The report's list: the checks, the prefill ratio's baseline when it is not stock,
    then per configuration its skip, its rounds, its prefill's reads, its notes and failures."""
    baseline = baseline if baseline is not None else stock_baseline(summaries)
    lines = [f"- {routing.text()}"]
    if (fallback := baseline.text()) is not None:
        lines.append(f"- {fallback}")
    label = {s.key: s.label for s in summaries}
    if not tokens and any(s.kind == "stream" and s.ok for s in summaries):
        lines.append(
            "- greedy tokens not compared: no stock or bmoe resident run has the streamed runs' "
            "weight layout (the gates check streamed == resident bit for bit)"
        )
    for t in tokens:
        this, ref = label.get(t.key, t.key), label.get(t.reference, t.reference)
        batches = ""
        if t.ubatches is not None:
            batches = (
                f" (its prompt prefilled in batches of {t.ubatches[0]} against {t.ubatches[1]}: not "
                "required equal)"
            )
        if t.equal:
            lines.append(f"- {this}: the same {t.compared} greedy tokens as {ref}{batches}")
        else:
            lines.append(
                f"- {this}: {t.same} of {t.compared} greedy tokens as {ref}, "
                f"first difference at position {t.first_difference}{batches}"
            )
    for s in summaries:
        if s.skipped is not None:
            lines.append(f"- {s.label}: skipped: {s.skipped}")
            continue
        if rounds > 1 and s.ok:
            lines.append(f"- {s.label}: decode tok/s of the {rounds} rounds {_rates(s.tok_s_rounds)}")
            if s.prefill_tok_s is not None:
                rates = _rates(s.prefill_tok_s_rounds)
                lines.append(f"- {s.label}: prefill tok/s of the {rounds} rounds {rates}")
        if s.prefill_read_mib is not None:
            stall = ""
            if s.prefill_stall_s is not None:
                stall = f", the compute waited {s.prefill_stall_s:.2f} s for reads"
            landed = ""
            if s.prefill_landed_mib is not None and s.prefill_landed_mib < s.prefill_read_mib:
                landed = f", {s.prefill_landed_mib:,.0f} MiB landed (the rest cancelled while queued)"
            passes = ""
            if s.prefill_passes is not None:
                passes = f", the experts {s.prefill_passes:.2f} times over"
            lines.append(
                f"- {s.label}: the prefill of {s.prompt_tokens} tokens in batches of {s.prefill_ubatch} "
                f"planned {s.prefill_read_mib:,.0f} MiB of reads (bmoe's counters{passes}){landed}{stall} "
                "(medians of the rounds)"
            )
        if s.system_ms_tok is not None and s.faults_per_tok is not None:
            prefill = ""
            if s.prefill_system_s is not None and s.prefill_minor_faults is not None:
                prefill = f"; the prefill {s.prefill_system_s:.2f} s and {s.prefill_minor_faults:,.0f} faults"
            lines.append(
                f"- {s.label}: system time {s.system_ms_tok:.2f} ms and {s.faults_per_tok:,.0f} minor page "
                f"faults per decoded token{prefill} (the process's, medians of the rounds)"
            )
        lines.extend(f"- {s.label}: {n}" for n in s.notes)
        for error, count in Counter(s.errors).items():
            lines.append(f"- {s.label}: failed in {count} of {rounds} rounds ({error})")
    return lines
