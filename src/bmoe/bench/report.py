"""From the rounds' raw figures to the run's outcome: each configuration's summary (medians,
peaks, its prefill's reads), its ratios to stock and to the disk ceiling, and :func:`conclude`,
which adds the two checks (:mod:`~bmoe.bench.checks`). The text of the report is
:mod:`~bmoe.bench.report_markdown`'s.

Pure: dictionaries in (what each child printed, plus the memory group's figures), values out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import attrs

from bmoe.bench.checks import RoutingCheck, TokenCheck, check_routing, check_tokens, token_reference
from bmoe.bench.configs import BenchConfig

MIB = 1024 * 1024


def median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


@attrs.frozen
class Summary:
    """One configuration over its rounds. Rates are medians of the rounds that finished;
    peaks are the largest of any round. ``skipped``: why it was not run at all (the memory
    limit, :mod:`~bmoe.bench.memory_fit`)."""

    key: str
    label: str
    kind: str
    cache_mib: int | None
    expert_percent: float | None
    tok_s: float | None
    tok_s_rounds: list[float | None]
    step_ms: float | None
    mib_per_tok: float | None  # bmoe's counters (streaming only)
    kernel_mib_per_tok: float | None  # /proc/<pid>/io read_bytes
    hit_rate: float | None
    stall_ms_tok: float | None  # the compute's wait for reads, per measured token
    early_used: float | None  # reads ahead a layer then used / reads ahead issued
    agreement: float | None  # prediction (or committed selection) slots the router agreed with
    dropped: float | None  # decode slots not read (drop) or served by a substitute
    peak_rss_bytes: int | None
    group_peak_bytes: int | None
    other_cpu_cores: float | None
    measured_tokens: int
    x_stock: float | None = None
    x_stock_norepack: float | None = None
    ceiling_tok_s: float | None = None  # disk bandwidth / MiB read per token
    of_ceiling: float | None = None
    probe_mib_s: float | None = None  # random O_DIRECT reads right before each round (median)
    of_probe_ceiling: float | None = None  # per round: tok/s x MiB/token / that probe (median)
    errors: list[str] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)
    skipped: str | None = None
    prompt_tokens: int = 0  # prefilled before the decode (0: no prefill)
    prefill_ubatch: int | None = None  # the prompt's batch (n_batch = n_ubatch) it ran with
    prefill_passes: float | None = None  # the prefill's reads over the experts' bytes (conclude)
    prefill_tok_s: float | None = None
    prefill_tok_s_rounds: list[float | None] = attrs.field(factory=list)
    prefill_s: float | None = None
    prefill_read_mib: float | None = None  # the prefill's reads as planned (bmoe's counters)
    prefill_landed_mib: float | None = None  # ... and what its reads landed (cancelled reads excluded)
    prefill_stall_s: float | None = None  # the prefill's wait for those reads
    prefill_kernel_read_mib: float | None = None  # /proc/<pid>/io read_bytes over the prefill
    prefill_x_stock: float | None = None  # prefill tok/s over the stock baseline's (StockBaseline)
    system_ms_tok: float | None = None  # the process's system CPU time per measured token
    faults_per_tok: float | None = None  # its minor page faults per measured token
    prefill_system_s: float | None = None  # ... over the prefill
    prefill_minor_faults: float | None = None

    @property
    def ok(self) -> bool:
        return self.tok_s is not None


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _prefill_median(ok: Sequence[dict[str, Any]], key: str, scale: float = 1.0) -> float | None:
    return median([float(r[key]) / scale for r in ok if r.get(key) is not None])


def summarize(config: BenchConfig, runs: Sequence[dict[str, Any]], skipped: str | None = None) -> Summary:
    """Median tok/s and step, per-token reads, hit rate and peaks of one configuration, and
    its prefill's median tok/s and reads; ``skipped``: why it did not run (no rounds)."""
    ok = [r for r in runs if "tok_s" in r and not r.get("error")]
    per_tok: list[float] = []
    kernel: list[float] = []
    hits = misses = 0
    stall: list[float] = []
    probes: list[float] = []
    of_probe: list[float] = []
    sums = dict.fromkeys(("prefetch_issued", "prefetch_hits", "slots", "agree", "decode_slots", "changed"), 0)
    for r in ok:
        n = max(1, int(r["measured_tokens"]))
        c = r.get("counters")
        if c is not None:
            per_tok.append(c["bytes_read"] / MIB / n)
            stall.append(1e3 * float(c.get("stall_s", 0.0)) / n)
            hits += int(c["hits"])
            misses += int(c["misses"])
            sums["prefetch_issued"] += int(c.get("prefetch_issued", 0))
            sums["prefetch_hits"] += int(c.get("prefetch_hits", 0))
            sums["slots"] += int(c.get("predict_slots", 0)) + int(c.get("route_ahead_slots", 0))
            sums["agree"] += int(c.get("predict_agree", 0)) + int(c.get("route_ahead_agree", 0))
            sums["decode_slots"] += int(c.get("decode_slots", 0))
            sums["changed"] += int(c.get("dropped", 0)) + int(c.get("substituted", 0))
        if r.get("kernel_read_bytes") is not None:
            kernel.append(r["kernel_read_bytes"] / MIB / n)
        if r.get("probe_mib_s"):
            probes.append(float(r["probe_mib_s"]))
            if c is not None:
                of_probe.append(float(r["tok_s"]) * c["bytes_read"] / MIB / n / float(r["probe_mib_s"]))
    rss = [int(r["end"]["VmHWM"]) for r in ok if "end" in r and "VmHWM" in r["end"]]
    group = [int(r["group"]["peak_bytes"]) for r in runs if r.get("group", {}).get("peak_bytes") is not None]
    other = [float(r["other_cpu_cores"]) for r in ok if "other_cpu_cores" in r]
    notes = list(dict.fromkeys(n for r in ok for n in r.get("notes", [])))
    if config.streams and config.cache_mib is None:  # auto: what the session chose, round by round
        chosen = [r["stream_info"]["budget_bytes"] // MIB for r in ok if r.get("stream_info")]
        if chosen:
            notes.insert(0, f"auto budget {', '.join(f'{m:,}' for m in chosen)} MiB (by round)")
    if any(not r.get("finite_logits", True) for r in ok):
        notes.append("NON-FINITE LOGITS")
    return Summary(
        key=config.key,
        label=config.label,
        kind=config.kind,
        cache_mib=config.cache_mib,
        expert_percent=config.expert_percent,
        tok_s=median([float(r["tok_s"]) for r in ok]),
        tok_s_rounds=[float(r["tok_s"]) if r in ok else None for r in runs],
        step_ms=median([float(r["step_ms_median"]) for r in ok]),
        mib_per_tok=median(per_tok),
        kernel_mib_per_tok=median(kernel),
        hit_rate=hits / (hits + misses) if hits + misses else None,
        stall_ms_tok=median(stall),
        early_used=_share(sums["prefetch_hits"], sums["prefetch_issued"]),
        agreement=_share(sums["agree"], sums["slots"]),
        dropped=_share(sums["changed"], sums["decode_slots"]) if sums["changed"] else None,
        peak_rss_bytes=max(rss) if rss else None,
        group_peak_bytes=max(group) if group else None,
        other_cpu_cores=max(other) if other else None,
        measured_tokens=min((int(r["measured_tokens"]) for r in ok), default=0),
        probe_mib_s=median(probes),
        of_probe_ceiling=median(of_probe),
        errors=[str(r["error"]) for r in runs if r.get("error")],
        notes=notes,
        skipped=skipped,
        prompt_tokens=min((int(r.get("prompt_tokens", 0)) for r in ok), default=0),
        prefill_ubatch=next((int(r["prefill_ubatch"]) for r in ok if r.get("prefill_ubatch")), None),
        prefill_tok_s=_prefill_median(ok, "prefill_tok_s"),
        prefill_tok_s_rounds=[
            float(r["prefill_tok_s"]) if r in ok and r.get("prefill_tok_s") is not None else None
            for r in runs
        ],
        prefill_s=_prefill_median(ok, "prefill_s"),
        prefill_read_mib=_prefill_median(ok, "prefill_read_bytes", MIB),
        prefill_landed_mib=_prefill_median(ok, "prefill_landed_bytes", MIB),
        prefill_stall_s=_prefill_median(ok, "prefill_stall_s"),
        prefill_kernel_read_mib=_prefill_median(ok, "prefill_kernel_read_bytes", MIB),
        system_ms_tok=median(
            [1e3 * float(r["system_s"]) / max(1, int(r["measured_tokens"])) for r in ok if "system_s" in r]
        ),
        faults_per_tok=median(
            [float(r["minor_faults"]) / max(1, int(r["measured_tokens"])) for r in ok if "minor_faults" in r]
        ),
        prefill_system_s=_prefill_median(ok, "prefill_system_s"),
        prefill_minor_faults=_prefill_median(ok, "prefill_minor_faults"),
    )


STOCK = "stock"
STOCK_NOREPACK = "stock-norepack"


@attrs.frozen
class StockBaseline:
    """The configuration the prefill ratios divide by: ``stock`` (llama.cpp's defaults,
    repacking on) when it has a prefill figure in this run, else ``stock-norepack``, and
    ``stock_state`` says why stock is not it ("skipped", "failed", "not run"); ``key`` None
    when neither has a figure (or no prefill was measured)."""

    key: str | None
    label: str | None = None
    stock_state: str | None = None  # None: stock is the baseline (or no prefill was measured)
    stock_skipped: str | None = None  # the skip's reason, when stock was skipped

    @property
    def fallback(self) -> bool:
        return self.key is not None and self.key != STOCK

    def column(self) -> str:
        """The ratio's column heading, naming the baseline when it is not stock."""
        if self.fallback:
            return f"prefill x {self.key} (stock {self.stock_state})"
        return "prefill x stock"

    def text(self) -> str | None:
        """The report's line on a fallback (None when stock is the baseline)."""
        if self.stock_state is None:
            return None
        why = f"stock was {self.stock_state}" + (f" ({self.stock_skipped})" if self.stock_skipped else "")
        if self.key is None:
            return f"prefill x stock: no stock prefill to divide by: {why}, and {STOCK_NOREPACK} has none"
        return f"prefill x stock: against {self.label}, since {why}"


def stock_baseline(summaries: Sequence[Summary]) -> StockBaseline:
    """``stock`` if it measured a prefill, else ``stock-norepack`` (saying why)."""
    by_key = {s.key: s for s in summaries}
    if not any(s.prefill_tok_s for s in summaries):
        return StockBaseline(None)  # no prefill measured (--prompt-tokens 0), or nothing finished
    stock = by_key.get(STOCK)
    if stock is not None and stock.prefill_tok_s:
        return StockBaseline(STOCK, stock.label)
    if stock is None:
        state, skipped = "not run", None
    elif stock.skipped is not None:
        state, skipped = "skipped", stock.skipped
    else:
        state, skipped = "failed", None
    norepack = by_key.get(STOCK_NOREPACK)
    if norepack is None or not norepack.prefill_tok_s:
        return StockBaseline(None, None, state, skipped)
    return StockBaseline(STOCK_NOREPACK, norepack.label, state, skipped)


def with_ratios(summaries: Sequence[Summary], bandwidth_mib_s: float) -> list[Summary]:
    """Each configuration's decode tok/s over both stock ones', its prefill tok/s over the
    stock baseline's (``stock_baseline``), and its disk ceiling: the tok/s the measured
    bandwidth allows at its MiB read per token (bmoe's counters)."""
    by_key = {s.key: s for s in summaries}
    base = stock_baseline(summaries)
    base_prefill = by_key[base.key].prefill_tok_s if base.key is not None else None

    def ratio(s: Summary, key: str) -> float | None:
        base = by_key.get(key)
        if base is None or not base.tok_s or s.tok_s is None:
            return None
        return s.tok_s / base.tok_s

    out = []
    for s in summaries:
        ceiling = None
        if s.mib_per_tok and bandwidth_mib_s > 0:
            ceiling = bandwidth_mib_s / s.mib_per_tok
        out.append(
            attrs.evolve(
                s,
                x_stock=ratio(s, "stock"),
                x_stock_norepack=ratio(s, "stock-norepack"),
                prefill_x_stock=(
                    s.prefill_tok_s / base_prefill if base_prefill and s.prefill_tok_s is not None else None
                ),
                ceiling_tok_s=ceiling,
                of_ceiling=s.tok_s / ceiling if ceiling and s.tok_s is not None else None,
            )
        )
    return out


def with_passes(summary: Summary, expert_bytes: int) -> Summary:
    """``summary`` with how many times over its prefill read the experts (where it read)."""
    if summary.prefill_read_mib is None or expert_bytes <= 0:
        return summary
    return attrs.evolve(summary, prefill_passes=summary.prefill_read_mib * MIB / expert_bytes)


@attrs.frozen
class Outcome:
    """What a run concluded: the summaries with their ratios, the two checks, and what the
    prefill ratios divide by."""

    summaries: list[Summary]
    checks: list[TokenCheck]
    routing: RoutingCheck
    baseline: StockBaseline = StockBaseline(None)


def conclude(
    configs: Sequence[BenchConfig],
    runs: dict[str, list[dict[str, Any]]],
    expert_bytes: int,
    bandwidth_mib_s: float,
    skipped: dict[str, str] | None = None,
    *,
    repack: bool = True,
) -> Outcome:
    """Summaries (medians, ratios, disk ceiling), greedy tokens against stock's (each
    configuration's first round that finished) and the routing probe's verdict.
    ``skipped``: ``{key: reason}`` of the configurations not run (they have no rounds)."""
    from bmoe.bench.configs import routing_probe

    skipped = skipped or {}
    summaries = with_ratios(
        [with_passes(summarize(c, runs.get(c.key, []), skipped.get(c.key)), expert_bytes) for c in configs],
        bandwidth_mib_s,
    )
    argmax = {
        key: next(r["argmax"] for r in rs if "argmax" in r)
        for key, rs in runs.items()
        if any("argmax" in r for r in rs)
    }
    ubatch = {s.key: s.prefill_ubatch for s in summaries if s.prefill_ubatch is not None}
    reference = token_reference(argmax, repack=repack)
    checks = check_tokens(argmax, reference, ubatch) if reference else []
    for config in configs:  # a routing policy against the same budget without it (lossy ones differ)
        base = "stream-auto" if config.cache_mib is None else f"stream-{config.cache_mib}"
        if config.policy is not None and config.key in argmax and base in argmax:
            checks += check_tokens({config.key: argmax[config.key], base: argmax[base]}, base)
    probe = routing_probe(list(configs), expert_bytes)
    probe_summary = next((s for s in summaries if probe is not None and s.key == probe.key), None)
    routing = check_routing(
        probe_summary.hit_rate if probe_summary else None, probe.expert_percent if probe else None
    )
    return Outcome(summaries, checks, routing, stock_baseline(summaries))
