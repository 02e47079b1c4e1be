"""The text summary of a ``bmoe_metrics v2`` file (pure: a parsed file in, lines out)."""

from __future__ import annotations

import statistics

from bmoe.domain.metrics import MetricsFile


def _decode_rows(m: MetricsFile) -> list[dict[str, float]]:
    """The decode tokens' rows: the first token is sampled from the prefill's logits."""
    return [r for r in m.rows if r["step"] > 1]


def _measured(values: list[float]) -> list[float]:
    return [v for v in values if v >= 0]


def summary_text(m: MetricsFile) -> str:
    """What the run was and what it did, a few lines."""
    c, s = m.config, m.summary
    lines = []
    what = c.get("model", "?")
    arch = c.get("arch")
    if arch:
        what += f" ({arch}"
        if c.get("n_expert", "0") not in ("0", ""):
            what += f", {c['n_expert']} experts, top-{c.get('n_expert_used', '?')}"
        what += ")"
    lines.append(f"model: {what}")
    if c.get("streaming") == "true":
        budget = float(c.get("cache_budget_mib", "0"))
        cache = "cache off" if budget == 0 else f"cache {budget:.0f} MiB"
        reads = "O_DIRECT" if c.get("odirect") == "true" else "buffered reads"
        mode = f"expert streaming, {cache}, {c.get('lanes', '?')} lanes, {reads}"
        if c.get("prefetch", "0") != "0":
            mode += f", prefetch {c['prefetch']}"
        if c.get("policy", "fast") != "fast":
            mode += f", {c['policy']} policy"
    else:
        mode = "resident"
    lines.append(f"mode: {mode}; prompt batch {c.get('prompt_batch', '?')}, {c.get('threads', '?')} threads")
    tokens = len(m.rows)
    line = f"tokens: {s.get('tokens', tokens)}"
    if "tok_s" in s:
        line += f", {m.summary_float('tok_s'):.2f} tok/s"
    if "prefill_s" in s:
        line += f"; prefill {s.get('n_prompt', '?')} tokens in {m.summary_float('prefill_s'):.3f} s"
    lines.append(line)
    rows = _decode_rows(m)
    walls = [r["wall_ms"] for r in rows]
    if walls:
        q = statistics.quantiles(walls, n=10, method="inclusive") if len(walls) > 1 else [walls[0]] * 9
        lines.append(
            f"per token: median {statistics.median(walls):.1f} ms, p90 {q[8]:.1f} ms, "
            f"min {min(walls):.1f} ms, max {max(walls):.1f} ms ({len(walls)} decode tokens)"
        )
    if m.summary_float("cache_hit_pct") >= 0 or m.summary_float("read_mib") >= 0:
        lines.append(
            f"decode: {m.summary_float('cache_hit_pct'):.1f}% hit, {m.summary_float('read_mib'):.1f} MiB "
            f"read; per token compute {m.summary_float('compute_s_tok') * 1000:.2f} ms + cache mgmt "
            f"{m.summary_float('mgmt_s_tok') * 1000:.2f} ms + waiting for reads "
            f"{m.summary_float('stall_s_tok') * 1000:.2f} ms (the lanes read for "
            f"{m.summary_float('io_s_tok') * 1000:.2f} ms)"
        )
    if "rss_mib" in m.columns:
        rss = _measured(m.column("rss_mib"))
        if rss:
            anon = _measured(m.column("rss_anon_mib")) if "rss_anon_mib" in m.columns else []
            peak = f"memory: peak RSS {max(rss):.1f} MiB"
            if anon:
                peak += f" (anonymous {max(anon):.1f} MiB)"
            lines.append(peak)
    if s.get("cancelled") == "true":
        lines.append("the run was cancelled")
    return "\n".join(lines) + "\n"
