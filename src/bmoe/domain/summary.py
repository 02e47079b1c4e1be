"""The human summary lines printed on stderr after a one-shot run (see docs/cli.md)."""

from __future__ import annotations

from bmoe.domain.generation import RunResult
from bmoe.domain.streaming import MIB, Budget, StreamCounters, StreamReport
from bmoe.domain.streaming.prefill_memory import PromptBatch
from bmoe.domain.streaming.step_account import StepAccount


def generation_line(result: RunResult) -> str:
    """``generation:`` tokens generated and decode speed."""
    return (
        f"generation: {len(result.tokens)} tokens, {result.decode_s_tok:.4f} s/token "
        f"({result.tok_s:.1f} tok/s)"
    )


def timing_line(result: RunResult, load_s: float, n_ubatch: int | None = None) -> str:
    """``timing:`` model load and prompt prefill (streaming: what it read, how many times
    over the experts, in ubatches of ``n_ubatch`` where given, and how long the compute
    waited for those reads)."""
    line = (
        f"timing: load {load_s:.2f} s, prefill {result.n_prompt} tokens in {result.prefill_s:.3f} s "
        f"({result.prefill_tps:.1f} tok/s)"
    )
    if result.n_restored:
        line += f"; {result.n_restored} restored from the prompt cache"
    if result.stream is not None:
        p, passes = result.stream.prefill, result.stream.prefill_passes
        line += f"; prefill read {p.read_mib:.1f} MiB"
        if passes is not None:
            ubatch = f", ubatch {n_ubatch}" if n_ubatch else ""
            line += f" (the experts {passes:.2f} times over{ubatch})"
        line += f", waited {p.stall_s:.3f} s for reads"
    if (d := result.drafts) is not None:
        line += (
            f"; drafts: {d.verifies} verifies, {d.accepted} of {d.drafted} drafted tokens accepted "
            f"({d.per_verify:.2f} tokens a verify)"
        )
        if d.paused:
            line += f", paused {d.paused} times"
        if result.stream is not None and result.tokens:
            line += f", {result.stream.decode.read_mib / len(result.tokens):.2f} MiB read a generated token"
    return line


def stream_mode_line(budget: Budget, lanes: int, odirect: bool, prompt_batch: int | PromptBatch) -> str:
    """``mode:`` of a streaming run (``auto``: its arithmetic, ``Budget.arithmetic``; a prompt
    batch sized from the room: its arithmetic, ``PromptBatch.describe``)."""
    how = budget.arithmetic() if budget.auto else "set"
    reads = "O_DIRECT" if odirect else "buffered reads"
    cache = "cache off" if budget.bytes == 0 else f"cache {budget.bytes / MIB:.0f} MiB ({how})"
    batch = (
        prompt_batch.describe() if isinstance(prompt_batch, PromptBatch) else f"prompt batch {prompt_batch}"
    )
    return f"mode: expert streaming, {cache}, {lanes} lanes, {reads}, {batch}"


def stream_lines(result: RunResult) -> list[str]:
    """``moe-stream:`` and ``moe-cache:`` lines (none when the run did not stream)."""
    report = result.stream
    if report is None:
        return []
    total = report.prefill.read_mib + report.decode.read_mib
    d = report.decode
    hit = f"{d.hit_pct:.1f}% hit" if d.hit_pct >= 0 else "no decode requests"
    per_tok = report.per_token(report.decode_wall_s)
    resident, budget = d.resident_bytes / 1048576, d.budget_bytes / 1048576
    evictions = report.prefill.evictions + d.evictions
    rereads = report.prefill.rereads + d.rereads
    recycled = report.prefill.pages_recycled + d.pages_recycled
    release = f" ({recycled} handed their pages to a read)" if recycled else ""
    tail = ""
    if d.release_s + d.release_lanes_s > 0:
        tail = (
            f"; evicted pages moved or given back in {1000 * report.per_token(d.release_s):.2f} ms/token "
            "on the eval thread"
            f" + {1000 * report.per_token(d.release_lanes_s):.2f} on the lanes"
        )
    if d.reads_orphaned:
        tail += f"; {d.reads_orphaned} evicted while being read ({d.orphans_cut} of those reads cut short)"
    passed = report.prefill.passed + d.passed
    if passed:
        tail += f"; {passed} layer calls passed (the layer cached whole: no request, no graph stop)"
    if d.evict_waits:
        tail += (
            f"; {d.evict_waits} evictions waited for their read to end "
            f"({1000 * report.per_token(d.evict_wait_s):.2f} ms/token)"
        )
    tail += _rule_text(d)
    lines = [
        f"moe-stream: {total:.1f} MiB read ({report.read_mib_tok:.2f} MiB/token), "
        f"decode {per_tok:.4f} s/token (compute {report.compute_s_tok:.4f} + cache mgmt "
        f"{report.mgmt_s_tok:.4f} + waiting for reads {report.stall_s_tok:.4f}; "
        f"the lanes read for {report.io_s_tok:.4f}; {StepAccount.of(report).text()})",
        f"moe-cache: {hit}, {resident:.1f} MiB resident of {budget:.1f} MiB budget; "
        f"{evictions} evictions{release}, {rereads} re-reads{tail}",
    ]
    if d.minor_faults or d.system_s or report.prefill.minor_faults or report.prefill.system_s:
        lines.append(kernel_line(report))
    issued = report.prefill.prefetch_issued + d.prefetch_issued
    if issued:
        used = report.prefill.prefetch_hits + d.prefetch_hits
        wasted = report.prefill.prefetch_wasted + d.prefetch_wasted
        tag = " [route-ahead]" if d.route_ahead_committed + d.route_ahead_passed else ""
        lines.append(
            f"moe-prefetch:{tag} {issued} experts read ahead{_ahead_source(report)}, {used} used "
            f"({_pct(used, issued)}), {wasted} evicted unused"
        )
    lines.extend(routing_lines(report))
    return lines


def _rule_text(d: StreamCounters) -> str:
    """The eviction rule in charge at the end and, under ``--cache-policy adaptive``, the
    chooser's switches in decode and each ghost cache's decode hit rate; under
    ``--cache-victims layer``, how many misses took their victim's row; under ``auto``, the
    scope now, its switches and what the twin under the other scope missed and moved."""
    if not d.cache_rule:
        return ""
    victims = ""
    if d.cache_victims == "layer":
        victims = f"; victims from the missing layer ({d.rows_swapped} read into their victim's row)"
    if d.twin_misses or d.victims_switches:  # --cache-victims auto
        switches = f"{d.victims_switches} switch" + ("" if d.victims_switches == 1 else "es")
        victims += (
            f"; victims' scope by cost (auto): {d.cache_victims or 'global'} now, {switches}; "
            f"under the other scope {d.twin_misses} misses, {d.twin_cross_evictions} page moves "
            f"(this cache {d.misses}, {d.cross_evictions})"
        )
    ghosts = d.ghost_pcts()
    if not ghosts:
        return f"; evicting by {d.cache_rule}{victims}"
    rates = ", ".join(f"{rule} {pct:.1f}%" for rule, pct in ghosts.items())
    switches = f"{d.rule_switches} switch" + ("" if d.rule_switches == 1 else "es")
    return f"; evicting by {d.cache_rule} (adaptive, {switches}; ghosts hit {rates}){victims}"


def kernel_line(report: StreamReport) -> str:
    """``moe-kernel:`` the process's system time and minor page faults, per decoded token and
    over the prefill: what the read path costs the kernel (each read that lands where no page
    was faults a fresh one in; recycled pages do not)."""
    d, p = report.decode, report.prefill
    return (
        f"moe-kernel: system time {1000 * report.per_token(d.system_s):.2f} ms/token and "
        f"{report.per_token(d.minor_faults):,.0f} minor page faults/token in decode; the prefill "
        f"{p.system_s:.2f} s and {p.minor_faults:,} faults (the process's, every thread)"
    )


def _ahead_source(report: StreamReport) -> str:
    """Which reads ahead the ``moe-prefetch:`` line counts: the prefill's rule is on by
    default (a batch routing half a layer's experts reads the whole next layer); decode's
    come from ``--prefetch``, ``--predict-prefetch`` or ``--route-ahead``."""
    prefill, decode = report.prefill.prefetch_issued, report.decode.prefetch_issued
    if not decode:
        return " (by the prefill: a batch routing half a layer's experts reads the next layer whole)"
    if not prefill:
        return " (in decode)"
    return f" ({prefill} by the prefill, {decode} in decode)"


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a"


def routing_lines(report: StreamReport) -> list[str]:
    """``moe-predict:``, ``moe-route-ahead:``, ``moe-drop:``, ``moe-substitute:`` and
    ``moe-watchdog:`` for the decode routing policies that ran."""
    d = report.decode
    lines = []
    steps = max(1, report.decode_steps)
    where = (
        f" on the worker (the eval thread waited {1e3 * d.rank_wait_s / steps:.2f})" if d.rank_worker else ""
    )
    cost = (
        f"ranking {1e3 * d.rank_s / steps:.2f} ms/token{where}, "
        f"issuing reads {1e3 * d.issue_s / steps:.2f} ms/token"
    )
    if d.predict_slots:
        per_layer = " ".join(_pct(a, s) for s, a in d.predict_layers if s)
        lines.append(
            f"moe-predict: the next layer's router on this layer's input named "
            f"{_pct(d.predict_agree, d.predict_slots)} of {d.predict_slots} routed slots "
            f"(per MoE layer: {per_layer}); {cost}"
        )
    gated = d.predict_gate_open + d.predict_gate_closed
    if gated:
        lines.append(
            f"moe-predict: auto: the gate was open on {d.predict_gate_open} of {gated} decode layer "
            f"calls ({_pct(d.predict_gate_open, gated)}): guesses are read while at most 10% of "
            "the slots miss the cache"
        )
    if d.route_ahead_committed + d.route_ahead_passed:
        lines.append(
            f"moe-route-ahead: {d.route_ahead_committed} routings committed, {d.route_ahead_passed} passed "
            f"through; committed selection agreed with the router on "
            f"{_pct(d.route_ahead_agree, d.route_ahead_slots)} of slots; {cost}"
        )
    if (d.route_ahead_committed + d.route_ahead_passed or d.predict_slots) and any(d.stall_layers):
        per_layer = " ".join(f"{1e3 * s / steps:.1f}" for s in d.stall_layers)
        lines.append(
            f"moe-stall: waiting for reads by layer, ms/token: {per_layer}; of the total "
            f"{1e3 * d.stall_s / steps:.1f}, {1e3 * d.stall_ahead_s / steps:.1f} in layers that missed "
            "nothing (reads ahead not landed yet)"
        )
    if d.dropped:
        lines.append(
            f"moe-drop: {d.dropped} of {d.decode_slots} decode slots not read "
            f"({_pct(d.dropped, d.decode_slots)}), weights zeroed and the survivors renormalised"
        )
    if d.substituted:
        lines.append(
            f"moe-substitute: {d.substituted} of {d.decode_slots} decode slots served by a resident "
            f"expert instead ({_pct(d.substituted, d.decode_slots)})"
        )
    if d.watchdog_trips:
        lines.append(
            f"moe-watchdog: the router evaluated here disagreed with the graph's ({d.watchdog_checks} "
            "checks): prediction and route-ahead are disarmed for this session"
        )
    return lines
