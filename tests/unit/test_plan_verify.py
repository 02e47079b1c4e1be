"""``python -m bmoe.plan --verify``'s own arithmetic (``bmoe.plan.verify``): the bench run it
asks for, the figures it reads back, the knee, and the comparison's verdicts."""

from __future__ import annotations

from pathlib import Path

from test_plan import MODEL, machine  # the made-up Qwen3-30B figures of the plan's tests

from bmoe.domain.plan.figures import MIB
from bmoe.domain.plan.predict import PlanSettings, make_plan
from bmoe.plan.verify import (
    Measured,
    VerifyOptions,
    bench_command,
    comparison,
    knee,
    knee_budgets,
    measured,
    plan_cache,
)

PLAN = make_plan(MODEL, machine(14), PlanSettings(cache_mb=4096, prompt_tokens=(2048,)))
AUTO = make_plan(MODEL, machine(14), PlanSettings(prompt_tokens=(2048,)))


def test_the_bench_runs_the_plan_s_flags_under_the_limit_and_throttle_asked_for() -> None:
    options = VerifyOptions(prompt_tokens=2048, mem_limit_mb=4096, disk_mib_s=400)
    cmd = bench_command(Path("m.gguf"), PLAN, ["4096", "2048"], options, Path("/tmp/out"))
    joined = " ".join(cmd)
    assert plan_cache(PLAN) == "4096" and plan_cache(AUTO) == "auto"
    assert knee_budgets(PLAN) == ["4096", "3072", "2048", "1024"]
    assert knee_budgets(AUTO)[0] == "auto" and knee_budgets(AUTO)[1] == str(round(AUTO.cache_mb * 0.75))
    assert "--budgets 4096,2048 --no-routing-check" in joined and "-b auto" in joined
    assert "--mem-limit-mb 4096" in joined and "--disk-mib-s 400" in joined
    assert "--prompt-tokens 2048" in joined and f"--ctx {PLAN.n_ctx}" in joined
    plain = " ".join(bench_command(Path("m.gguf"), PLAN, ["auto"], VerifyOptions(), Path("/tmp/out")))
    assert "--mem-limit-mb" not in plain and "--disk-mib-s" not in plain and "--prompt-tokens 0" in plain


def test_the_figures_are_read_for_the_budget_asked_and_a_budget_that_failed_is_none() -> None:
    summaries = [
        {"key": "stream-auto", "tok_s": 2.0, "mib_per_tok": 300.0, "hit_rate": 0.5, "prefill_s": 9.0},
        {"key": "stream-2048", "tok_s": None, "errors": ["OOM"]},
    ]
    assert measured(summaries, "auto") == Measured(2.0, 300.0, 0.5, 9.0)
    assert measured(summaries, "2048") is None and measured(summaries, "1") is None


def test_the_knee_is_the_smallest_cache_within_a_tenth_of_the_best_decode() -> None:
    results = {4096: Measured(2.0, 0, 0, 0), 3072: Measured(1.85, 0, 0, 0), 2048: Measured(1.5, 0, 0, 0)}
    assert knee(results) == 3072 and knee({}) is None


def test_the_comparison_says_inside_or_outside_for_each_figure() -> None:
    d = PLAN.decode
    inside = Measured(d.expected.tok_s, d.expected.read_bytes / MIB, d.expected.hit_rate, 0.0)
    lines = comparison(PLAN, inside, 0)
    assert len(lines) == 3 and all("inside the range" in line for line in lines)
    outside = Measured(d.high.tok_s * 2, 0.0, 1.0, 30.0)
    lines = comparison(PLAN, outside, 2048)
    assert all("OUTSIDE" in line for line in lines[:3]) and "prefill 2,048" in lines[3]


def test_a_prompt_beyond_the_plan_s_context_is_refused_before_any_run(capsys) -> None:
    import attrs

    from bmoe.plan.verify import verify
    from bmoe.runtime.planning import PlannedModel

    short = attrs.evolve(PLAN, n_ctx=256)
    assert verify(PlannedModel(short, "test"), Path("m.gguf"), VerifyOptions(prompt_tokens=2048)) == 1
    assert "give -c 2,088 or more" in capsys.readouterr().err
