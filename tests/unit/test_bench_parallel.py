"""``python -m bmoe.bench --parallel``: its counts, its texts, its teacher forcing of several
sequences and its report, against scripted fakes (no model)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import pytest

from bmoe.bench import configs as cf
from bmoe.bench import parallel_report
from bmoe.bench.arguments import parser
from bmoe.bench.decode import teacher_force_parallel
from bmoe.bench.run_plan import make_plan


def test_counts_are_parsed_sorted_once_each_and_bounded() -> None:
    assert cf.parse_parallel("4,1,2,4") == (1, 2, 4)
    for bad in ("0", "1,x", "", f"{cf.MAX_PARALLEL + 1}"):
        with pytest.raises(cf.BenchConfigError):
            cf.parse_parallel(bad)


def test_each_configuration_runs_at_each_count_under_its_own_key() -> None:
    base = cf.build_configs(["stock", "resident", "stream"], [cf.Budget(mib=10)], 40 * cf.MIB)
    out = cf.with_parallel(base, (1, 4))
    assert [c.key for c in out] == [f"{c.key}-np{n}" for c in base for n in (1, 4)]
    four = next(c for c in out if c.key == "resident-np4")
    assert four.parallel == 4 and four.plain_key == "resident" and four.label.endswith(", 4 sequences")
    assert next(c for c in out if c.key == "resident-np1").label.endswith(", 1 sequence")


def test_routing_policies_are_refused_with_several_sequences() -> None:
    base = cf.build_configs(["stream"], [cf.Budget(mib=10)], 40 * cf.MIB, policies=(cf.Policy("predict"),))
    with pytest.raises(cf.BenchConfigError, match="routing policies"):
        cf.with_parallel(base, (1, 2))
    assert len(cf.with_parallel(base, (1,))) == len(base)


def test_a_sequence_has_the_same_text_at_every_count_and_the_texts_start_apart() -> None:
    tokens = list(range(100))
    four = cf.sequence_texts(tokens, 4, 4, 10)
    assert [t[0] for t in four] == [0, 30, 60, 90] and all(len(t) == 10 for t in four)
    assert cf.sequence_texts(tokens, 2, 4, 10) == four[:2]
    assert cf.sequence_texts(tokens, 1, 1, 10) == [tokens[:10]]
    with pytest.raises(cf.BenchConfigError, match="cannot give 4 sequences"):
        cf.sequence_texts(list(range(12)), 4, 4, 10)


def _args(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["-m", "x.gguf", *argv])


def test_the_plan_sizes_each_count_s_context_and_refuses_policies_with_several() -> None:
    plan = make_plan(_args("--parallel", "1,4", "--prompt-tokens", "100", "--tokens", "64"), 2000)
    assert plan.parallel == (1, 4) and plan.fed == 180
    one, four = cf.with_parallel(cf.build_configs(["resident"], [], 0), plan.parallel)
    assert plan.n_ctx_for(one) == plan.n_ctx == 256
    assert plan.n_ctx_for(four) == 768  # 4 x 180 = 720, in steps of 256
    with pytest.raises(cf.BenchConfigError, match="--policies"):
        make_plan(_args("--parallel", "2", "--policies", "predict"), 2000)
    with pytest.raises(cf.BenchConfigError, match="cannot give 8 sequences"):
        make_plan(_args("--parallel", "8", "--prompt-tokens", "400"), 485)


class FakeParallel:
    """Greedy choice of row i = its fed token + 1; each step takes one tick."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.steps: list[list[tuple[int, int, int]]] = []

    def step_all(self, entries: Sequence[tuple[int, int, int]]) -> None:
        self.steps.append(list(entries))
        self.clock[0] += 1.0

    def argmax_row(self, row: int) -> int:
        return self.steps[-1][row][0] + 1


def test_parallel_teacher_forcing_steps_every_sequence_together_and_times_only_the_measure() -> None:
    clock = [0.0]
    fake = FakeParallel(clock)
    started: list[int] = []
    texts = [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]
    d = teacher_force_parallel(
        fake,
        texts,
        1,
        2,
        start=1,
        on_measure_start=lambda: started.append(len(fake.steps)),
        clock=lambda: clock[0],
    )
    assert fake.steps == [
        [(11, 1, 0), (21, 1, 1)],
        [(12, 2, 0), (22, 2, 1)],
        [(13, 3, 0), (23, 3, 1)],
    ]
    assert started == [1]
    assert d.argmax == [[12, 13, 14], [22, 23, 24]]
    assert d.measured == 4 and d.sequences == 2 and d.warmup == 1
    assert d.tok_s == pytest.approx(2.0) and d.seq_tok_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="a sequence holds 3"):
        teacher_force_parallel(fake, [[1, 2, 3, 4], [1, 2, 3]], 1, 3)


def _run(tok_s: float, n: int, argmax: list[list[int]], read_mib: float | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {
        "tok_s": tok_s,
        "seq_tok_s": tok_s / n,
        "measured_tokens": 4 * n,
        "step_ms_median": 1000 * n / tok_s,
        "argmax": [t for seq in argmax for t in seq],
        "seq_argmax": argmax,
        "parallel": n,
    }
    if read_mib is not None:
        r["counters"] = {"bytes_read": read_mib * cf.MIB * 4 * n, "hits": 1, "misses": 3}
    return r


def test_each_count_is_concluded_against_stock_at_the_same_count() -> None:
    configs = cf.with_parallel(
        cf.build_configs(["stock", "stream"], [cf.Budget(mib=10)], 40 * cf.MIB), (1, 2)
    )
    keys = [c.key for c in configs]
    assert keys == ["stock-np1", "stock-np2", "stream-10-np1", "stream-10-np2"]
    runs = {
        "stock-np1": [_run(10.0, 1, [[1, 2, 3]])],
        "stock-np2": [_run(16.0, 2, [[1, 2, 3], [4, 5, 6]])],
        "stream-10-np1": [_run(5.0, 1, [[1, 2, 3]], read_mib=2.0)],
        "stream-10-np2": [_run(8.0, 2, [[1, 2, 9], [4, 5, 6]], read_mib=1.5)],
    }
    outcome = parallel_report.conclude(configs, runs, 40 * cf.MIB, 100.0)
    by_key = {s.key: s for s in outcome.summaries}
    assert set(by_key) == set(keys)
    assert by_key["stream-10-np2"].x_stock == pytest.approx(0.5)  # 8 over stock's 16 at 2
    assert by_key["stream-10-np1"].x_stock == pytest.approx(0.5)
    checks = {(t.key, t.reference): t for t in outcome.checks}
    assert checks[("stream-10-np1", "stock-np1")].equal
    two = checks[("stream-10-np2", "stock-np2")]
    assert not two.equal and two.first_difference == 2 and two.compared == 6
    rows = {(r.label, r.sequences): r for r in parallel_report.rows(configs, outcome, runs)}
    assert rows[("stream-10", 2)].x_one == pytest.approx(1.6)
    assert rows[("stream-10", 2)].mib_per_tok_x_one == pytest.approx(0.75)
    assert rows[("stock", 2)].seq_tok_s == pytest.approx(8.0)
    table = parallel_report.markdown_table(list(rows.values()))
    assert "| stream-10 | 2 | 8.00 | 4.00 |" in table
    [line, stock_line] = sorted(parallel_report.seq0_lines(configs, runs), key=lambda s: "stock" in s)
    assert "chose 2 of 3 greedy tokens as stream-10 alone" in line
    assert "chose 3 of 3" in stock_line
