"""A plan as the small table ``python -m bmoe.plan`` prints (``--json``:
``bmoe.domain.plan.document``)."""

from __future__ import annotations

import math

from bmoe.domain.plan.figures import MIB
from bmoe.domain.plan.predict import Plan, resident_headroom


def _mib(n: float) -> str:
    if n >= 10 * 1024 * MIB:
        return f"{n / (1024 * MIB):.1f} GiB"
    return f"{n / MIB:.0f} MiB" if n >= 10 * MIB else f"{n / MIB:.2f} MiB"


def _rate(tok_s: float) -> str:
    return "unbounded" if math.isinf(tok_s) else f"{tok_s:.1f} tok/s"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 100 else f"{s:.1f} s" if s >= 1 else f"{s:.2f} s"


def rows(plan: Plan) -> list[tuple[str, str]]:
    """``(what, figure)`` rows of the table."""
    m, mc = plan.model, plan.machine
    k = m.n_expert_used
    out = [
        ("model", f"{m.arch}, {m.n_layer} layers, {m.n_expert} experts, top-{k}, {_mib(m.file_bytes)}"),
        ("dense", _mib(m.dense_bytes)),
        ("experts", f"{_mib(m.expert_bytes)} ({m.n_moe_layers} MoE layers)"),
        ("one expert", f"{_mib(m.entry_bytes)} (reads of {_mib(m.read_bytes)})"),
        ("one token's working set", f"{_mib(m.token_cycle_bytes)} ({k} experts x {m.n_moe_layers} layers)"),
        (
            "KV cache",
            f"{m.kv_bytes_per_token / 1024:.1f} KiB a token; {_mib(plan.kv_bytes)} at -c {plan.n_ctx}",
        ),
        ("compute buffer", f"{plan.compute_per_token / MIB:.3f} MiB a prompt token (estimated)"),
        (
            "machine",
            f"room {_mib(mc.room.room_bytes)} ({mc.room_source}); disk {mc.disk_mib_s:.0f} MiB/s "
            f"({mc.disk_source}); {mc.cores} cores; compute: {mc.compute_source or 'numpy'}",
        ),
        (
            "resident",
            ("fits" if plan.resident_fits else "does not fit")
            + f" (needs {_mib(plan.resident_needs_bytes)} + {resident_headroom(mc.room).describe()})",
        ),
        (
            "streamed",
            ("fits" if plan.streamed_fits else "does not fit")
            + " (dense + KV + compute + two layers' experts + the run's margin: "
            + f"{_mib(plan.streamed_needs_bytes)})",
        ),
        (
            "cache budget",
            f"{_mib(plan.budget.bytes)}"
            + (" (auto)" if plan.budget.auto else "")
            + (" (cycles: below one token's working set)" if plan.cycles else ""),
        ),
    ]
    d = plan.decode
    hits = "; ".join(f"{g.rate:.0%} {g.name}" for g in d.guesses)
    out.append(("expected hit rate", f"{d.expected.hit_rate:.0%} ({d.expected_guess.name}); guesses: {hits}"))
    out.append(
        (
            "read a token",
            f"{_mib(d.expected.read_bytes)} (from {_mib(d.high.read_bytes)} to {_mib(d.low.read_bytes)})",
        )
    )
    c = plan.costs
    out.append(
        (
            "decode",
            f"{_rate(d.expected.tok_s)}, {plan.decode_bound}-bound (from {_rate(d.low.tok_s)} to "
            f"{_rate(d.high.tok_s)}; resident step {c.resident_step_s * 1000:.1f} ms, "
            f"{c.cpu_s_per_mib * 1000:.2f} ms a MiB read beyond the read: {c.cpu_source})",
        )
    )
    for p in plan.prefills:
        longer = f", longer than -c {plan.n_ctx}" if p.tokens > plan.n_ctx else ""
        out.append(
            (
                f"prefill {p.tokens:,} tokens",
                f"{_seconds(p.seconds)} ({_seconds(p.fastest_s)} to {_seconds(p.slowest_s)}), "
                f"{p.bound}-bound "
                f"(reads {_mib(p.read_bytes)} at -b {plan.prompt_batch}{longer})",
            )
        )
    out.append(("flags", " ".join(plan.flags())))
    return out


def render(plan: Plan, source: str) -> str:
    """The table, with the source line above and the plan's notes below."""
    table = rows(plan)
    width = max(len(what) for what, _ in table)
    lines = [source, *(f"  {what:<{width}}  {figure}" for what, figure in table)]
    lines += [f"note: {note}" for note in plan.notes()]
    return "\n".join(lines)
