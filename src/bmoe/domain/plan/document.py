"""A plan's figures as JSON, for programs: ``python -m bmoe.plan --json`` and the server's
``/props`` (its ``bmoe.plan``)."""

from __future__ import annotations

import math
from typing import Any

from bmoe.domain.plan.predict import Plan


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
            "compute_source": mc.compute_source,
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
            "hit_guesses": [{"name": g.name, "hit_rate": round(g.rate, 4)} for g in plan.decode.guesses],
            "expected_guess": plan.decode.expected_guess.name,
            "decode_range": {
                end: {
                    "hit_rate": round(f.hit_rate, 4),
                    "read_bytes_per_token": round(f.read_bytes),
                    "tok_s": finite(f.tok_s),
                }
                for end, f in (
                    ("low", plan.decode.low),
                    ("expected", plan.decode.expected),
                    ("high", plan.decode.high),
                )
            },
            "cpu_s_per_mib": plan.costs.cpu_s_per_mib,
            "cpu_source": plan.costs.cpu_source,
            "prefill": [
                {
                    "tokens": p.tokens,
                    "seconds": finite(p.seconds),
                    "fastest_seconds": finite(p.fastest_s),
                    "slowest_seconds": finite(p.slowest_s),
                    "read_bytes": p.read_bytes,
                    "bound": p.bound,
                }
                for p in plan.prefills
            ],
        },
        "flags": plan.flags(),
        "notes": plan.notes(),
    }
