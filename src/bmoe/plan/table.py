"""A plan as the small table ``python -m bmoe.plan`` prints, and as JSON (``--json``, the
server's ``/props``)."""

from __future__ import annotations

import math
from typing import Any

from bmoe.domain.plan.figures import MIB
from bmoe.domain.plan.predict import Plan


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
            f"({mc.disk_source}); {mc.cores} cores",
        ),
        (
            "resident",
            ("fits" if plan.resident_fits else "does not fit")
            + f" (needs {_mib(plan.resident_needs_bytes)} + 1024 MiB free)",
        ),
        (
            "streamed",
            ("fits" if plan.streamed_fits else "does not fit")
            + f" (dense + KV + compute + one token's working set: {_mib(plan.streamed_needs_bytes)})",
        ),
        (
            "cache budget",
            f"{_mib(plan.budget.bytes)}"
            + (" (auto)" if plan.budget.auto else "")
            + (" (cycles: below one token's working set)" if plan.cycles else ""),
        ),
    ]
    hit = f"{plan.hit_rate:.0%} (uniform routing, a floor)"
    if plan.profile_hit_rate is not None:
        hit += f"; {plan.profile_hit_rate:.0%} by this model's usage profile"
    out.append(("expected hit rate", hit))
    out.append(("read a token", f"{_mib(plan.read_bytes_per_token)}"))
    out.append(
        (
            "decode",
            f"{_rate(plan.decode_tok_s)}, {plan.decode_bound}-bound (disk {_rate(plan.disk_tok_s)}, "
            f"compute {_rate(plan.compute_tok_s)})",
        )
    )
    for p in plan.prefills:
        longer = f", longer than -c {plan.n_ctx}" if p.tokens > plan.n_ctx else ""
        out.append(
            (
                f"prefill {p.tokens:,} tokens",
                f"{_seconds(p.seconds)}, {p.bound}-bound "
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


def to_json(plan: Plan, source: str = "") -> dict[str, Any]:
    """The plan's figures for programs (sizes in bytes, speeds in tokens a second; null
    where unbounded)."""
    m, mc = plan.model, plan.machine

    def finite(x: float) -> float | None:
        return None if math.isinf(x) else round(x, 3)

    return {
        "source": source,
        "model": {
            "name": m.name,
            "arch": m.arch,
            "file_bytes": m.file_bytes,
            "n_layer": m.n_layer,
            "n_moe_layers": m.n_moe_layers,
            "n_expert": m.n_expert,
            "n_expert_used": m.n_expert_used,
            "dense_bytes": m.dense_bytes,
            "expert_bytes": m.expert_bytes,
            "entry_bytes": m.entry_bytes,
            "read_bytes": m.read_bytes,
            "token_cycle_bytes": m.token_cycle_bytes,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "compute_bytes_per_prompt_token": round(plan.compute_per_token),
        },
        "machine": {
            "room_bytes": mc.room.room_bytes,
            "room_source": mc.room_source,
            "disk_mib_s": round(mc.disk_mib_s, 1),
            "disk_source": mc.disk_source,
            "cores": mc.cores,
            "matvec_bytes_s": round(mc.matvec_bytes_s),
            "matmul_flops": round(mc.matmul_flops),
            "free_disk_bytes": mc.free_disk_bytes,
        },
        "n_ctx": plan.n_ctx,
        "kv_bytes": plan.kv_bytes,
        "prompt_batch": plan.prompt_batch,
        "resident": {"fits": plan.resident_fits, "needs_bytes": plan.resident_needs_bytes},
        "streamed": {
            "fits": plan.streamed_fits,
            "needs_bytes": plan.streamed_needs_bytes,
            "cache_bytes": plan.budget.bytes,
            "cache_auto": plan.budget.auto,
            "cache_cycles": plan.cycles,
            "hit_rate": round(plan.hit_rate, 4),
            "profile_hit_rate": None if plan.profile_hit_rate is None else round(plan.profile_hit_rate, 4),
            "profile_curve": [
                {"cache_bytes": p.budget_bytes, "hit_rate": round(p.hit_rate, 4)} for p in plan.profile_curve
            ],
            "read_bytes_per_token": round(plan.read_bytes_per_token),
            "decode_tok_s": finite(plan.decode_tok_s),
            "decode_bound": plan.decode_bound,
            "disk_tok_s": finite(plan.disk_tok_s),
            "compute_tok_s": finite(plan.compute_tok_s),
            "prefill": [
                {
                    "tokens": p.tokens,
                    "seconds": finite(p.seconds),
                    "read_bytes": p.read_bytes,
                    "bound": p.bound,
                }
                for p in plan.prefills
            ],
        },
        "flags": plan.flags(),
        "notes": plan.notes(),
    }
