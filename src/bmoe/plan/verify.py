"""``python -m bmoe.plan --verify``: the plan checked on this machine.

The plan's own flags (its ``--cache-mb``, ``-c``, ``-b``; ``--mem-limit-mb`` as a memory group and
``--disk-mib-s`` as a disk throttle where they were given) run a short teacher-forced decode
(``DECODE_TOKENS`` after ``WARMUP_TOKENS``) and, with ``--prompt-tokens N`` given, a prefill of
N tokens first: ``python -m bmoe.bench`` does it, in a process of its own, the page cache
dropped. Each figure is printed predicted (its range) beside measured. What was measured is
kept (``bmoe.runtime.planning.keep_verified``): the next plan of this model here predicts
from it (``bmoe.domain.plan.verified``).

``--knee`` also decodes at ``KNEE_SHARES`` of the plan's budget and names the smallest cache
whose decode is within ``KNEE_WITHIN`` of the best measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from bmoe.adapters.file_writes import scratch_folder
from bmoe.domain.plan.figures import MIB
from bmoe.domain.plan.predict import Plan
from bmoe.domain.plan.verified import VerifiedRun
from bmoe.errors import FileNotKeptError
from bmoe.runtime.planning import PlannedModel, keep_verified

WARMUP_TOKENS = 8
DECODE_TOKENS = 32
KNEE_SHARES = (1.0, 0.75, 0.5, 0.25)
KNEE_WITHIN = 0.10  # of the best measured decode


@attrs.frozen
class VerifyOptions:
    """What to verify: ``prompt_tokens`` (0: no prefill), ``mem_limit_mb`` and
    ``disk_mib_s`` (0: none), ``knee``; ``out``: the bench's folder (None: a temporary one)."""

    prompt_tokens: int = 0
    mem_limit_mb: int = 0
    disk_mib_s: float = 0.0
    knee: bool = False
    out: Path | None = None


@attrs.frozen
class Measured:
    tok_s: float
    read_mib_token: float
    hit_rate: float
    prefill_s: float


def plan_cache(plan: Plan) -> str:
    """The ``--cache-mb`` of the plan's flags: ``auto`` or MiB."""
    flags = plan.flags()
    return flags[flags.index("--cache-mb") + 1]


def knee_budgets(plan: Plan) -> list[str]:
    """The plan's own budget, then ``KNEE_SHARES`` of its MiB below it."""
    smaller = [str(max(1, round(plan.cache_mb * s))) for s in KNEE_SHARES if s < 1.0]
    return list(dict.fromkeys([plan_cache(plan), *smaller]))


def bench_command(
    model: Path, plan: Plan, budgets: Sequence[str], options: VerifyOptions, out: Path
) -> list[str]:
    """The bench run that measures ``budgets`` with the plan's flags."""
    cmd = [sys.executable, "-m", "bmoe.bench", "-m", str(model), "--configs", "stream"]
    cmd += ["--budgets", ",".join(budgets), "--no-routing-check", "--rounds", "1"]
    cmd += ["--warmup", str(WARMUP_TOKENS), "--tokens", str(DECODE_TOKENS), "--probe-mib", "0"]
    cmd += [
        "--prompt-tokens",
        str(options.prompt_tokens),
        "-b",
        "auto",  # sized from the room, as the plan's flags leave it (Plan.flags)
        "--ctx",
        str(plan.n_ctx),
    ]
    cmd += ["--no-chart", "--out", str(out)]
    if options.mem_limit_mb:
        cmd += ["--mem-limit-mb", str(options.mem_limit_mb)]
    if options.disk_mib_s:
        cmd += ["--disk-mib-s", f"{options.disk_mib_s:g}"]
    return cmd


def measured(summaries: Sequence[Mapping[str, Any]], budget: str) -> Measured | None:
    """The bench's figures of the budget ``budget`` (``auto`` or MiB; None where it did not
    run)."""
    for s in summaries:
        if s.get("key") == f"stream-{budget}" and s.get("tok_s"):
            return Measured(
                tok_s=float(s["tok_s"]),
                read_mib_token=float(s.get("mib_per_tok") or 0.0),
                hit_rate=float(s.get("hit_rate") or 0.0),
                prefill_s=float(s.get("prefill_s") or 0.0),
            )
    return None


def _inside(value: float, low: float, high: float) -> str:
    lo, hi = min(low, high), max(low, high)
    return "inside the range" if lo * 0.999 <= value <= hi * 1.001 else "OUTSIDE the range"


def comparison(plan: Plan, got: Measured, prompt_tokens: int) -> list[str]:
    """Predicted beside measured, a line a figure."""
    d = plan.decode
    hits = [g.rate for g in d.guesses]
    lines = [
        f"  hit rate       predicted {d.expected.hit_rate:.1%} ({min(hits):.1%} to {max(hits):.1%}), "
        f"measured {got.hit_rate:.1%}: {_inside(got.hit_rate, min(hits), max(hits))}",
        f"  MiB a token    predicted {d.expected.read_bytes / MIB:.1f} ({d.high.read_bytes / MIB:.1f} to "
        f"{d.low.read_bytes / MIB:.1f}), measured {got.read_mib_token:.1f}: "
        f"{_inside(got.read_mib_token, d.high.read_bytes / MIB, d.low.read_bytes / MIB)}",
        f"  decode tok/s   predicted {d.expected.tok_s:.2f} ({d.low.tok_s:.2f} to {d.high.tok_s:.2f}), "
        f"measured {got.tok_s:.2f} ({d.expected.tok_s / got.tok_s - 1:+.0%}): "
        f"{_inside(got.tok_s, d.low.tok_s, d.high.tok_s)}",
    ]
    pre = next((p for p in plan.prefills if p.tokens == prompt_tokens), None)
    if pre is not None and got.prefill_s > 0:
        lines.append(
            f"  prefill {prompt_tokens:,}  predicted {pre.seconds:.1f} s ({pre.fastest_s:.1f} to "
            f"{pre.slowest_s:.1f}), measured {got.prefill_s:.1f} s ({pre.seconds / got.prefill_s - 1:+.0%}): "
            f"{_inside(got.prefill_s, pre.fastest_s, pre.slowest_s)}"
        )
    return lines


def knee(results: Mapping[int, Measured]) -> int | None:
    """The smallest budget (MiB) whose decode is within ``KNEE_WITHIN`` of the best measured."""
    if not results:
        return None
    best = max(m.tok_s for m in results.values())
    return min(b for b, m in results.items() if m.tok_s >= (1.0 - KNEE_WITHIN) * best)


def verified_run(plan: Plan, got: Measured, options: VerifyOptions) -> VerifiedRun:
    """What to keep of the plan's own budget's run: the figures measured and the ones the
    plan used."""
    where = f"--mem-limit-mb {options.mem_limit_mb}" if options.mem_limit_mb else "no memory limit"
    where += (
        f", the disk held to {options.disk_mib_s:g} MiB/s" if options.disk_mib_s else ", the disk as it is"
    )
    share = plan.model.cache_share(plan.budget.bytes)
    return VerifiedRun(
        cache_share=share,
        hit_rate=got.hit_rate,
        read_mib_token=got.read_mib_token,
        tok_s=got.tok_s,
        disk_mib_s=plan.costs.disk_mib_s,
        resident_step_s=plan.costs.resident_step_s,
        prefill_tokens=options.prompt_tokens if got.prefill_s > 0 else 0,
        prefill_s=got.prefill_s,
        where=where,
    )


def verify(planned: PlannedModel, model: Path, options: VerifyOptions) -> int:
    """Run the check (module docstring); 0 where the plan's budget ran, else 1."""
    plan = planned.plan
    fed = options.prompt_tokens + WARMUP_TOKENS + DECODE_TOKENS
    if fed > plan.n_ctx:
        print(
            f"verify: a {options.prompt_tokens:,}-token prompt and {WARMUP_TOKENS + DECODE_TOKENS} tokens "
            f"of decode do not fit the plan's context (-c {plan.n_ctx:,}): give -c {fed:,} or more, "
            "or fewer --prompt-tokens",
            file=sys.stderr,
        )
        return 1
    own = plan_cache(plan)
    budgets = knee_budgets(plan) if options.knee else [own]
    with scratch_folder("bmoe-verify-", "the verify run's bench report") as scratch:
        out = options.out or scratch
        cmd = bench_command(model, plan, budgets, options, out)
        print("verify: " + " ".join(cmd[1:]), file=sys.stderr)
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
        try:
            summaries = json.loads((out / "bench.json").read_text())["summaries"]
        except (OSError, ValueError, KeyError):
            print(f"verify: the bench wrote no figures (exit status {done.returncode})", file=sys.stderr)
            return 1
    results = {b: m for b in budgets if (m := measured(summaries, b)) is not None}
    for budget in budgets:
        got = results.get(budget)
        if got is None:
            print(f"--cache-mb {budget}: did not run (see the bench's lines above)")
            continue
        print(f"--cache-mb {budget}:")
        at = plan if budget == own else planned.at_budget(int(budget))
        print("\n".join(comparison(at, got, options.prompt_tokens)))
    sized = {int(b) if b != "auto" else plan.cache_mb: m for b, m in results.items()}
    if options.knee and (best := knee(sized)) is not None:
        print(f"knee: --cache-mb {best}, the smallest cache within {KNEE_WITHIN:.0%} of the best decode")
    if own not in results:
        return 1
    try:
        kept_at = keep_verified(model, verified_run(plan, results[own], options))
        print(f"kept: {kept_at} (the next plan of this model here predicts from it)")
    except FileNotKeptError as exc:
        print(f"verify: {exc}", file=sys.stderr)
    return 0
