"""The pure parts of ``python -m bmoe.bench``: arguments, budgets, round order, the medians
and ratios of the report, the token and routing checks, cgroup site choice, teacher forcing,
the timed prefill and its columns, the memory limit's skip of ``stock``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from bmoe.bench import configs as cf
from bmoe.bench import report
from bmoe.bench.arguments import parser
from bmoe.bench.cgroup import CgroupError, CgroupSite, MemoryGroup, candidate_sites
from bmoe.bench.checks import TokenCheck, check_routing, check_tokens, token_reference
from bmoe.bench.decode import teacher_force
from bmoe.bench.memory_fit import UNCONFINED_NOTE, outside_the_limit, repack_skip_reason, skipped_configs
from bmoe.bench.prefill import PREFILL_BATCH, timed_prefill
from bmoe.bench.procfs import parse_io
from bmoe.bench.report_markdown import markdown_table, summary_lines
from bmoe.bench.run_plan import make_plan

MIB = 1024 * 1024

# -- arguments and configurations ------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    return parser().parse_args(list(argv))


def test_defaults_run_every_kind_at_three_budgets() -> None:
    args = _args()
    plan = make_plan(args)
    assert plan.kinds == list(cf.KINDS)
    assert plan.budgets == [cf.Budget(mib=0), cf.Budget(percent=25.0), cf.Budget(percent=50.0)]
    assert args.prompt_tokens == 464
    assert plan.fed == 464 + 16 + 64 and plan.n_ctx == 544  # the prompt, then the decode after it


def test_without_a_prefill_the_context_holds_the_decode_only() -> None:
    plan = make_plan(_args("--prompt-tokens", "0"))
    assert plan.fed == 80 and plan.n_ctx == 256


def test_model_and_size_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        _args("-m", "x.gguf", "--size-gb", "2")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--configs", "stock,turbo"], "unknown configuration turbo"),
        (["--budgets", "12x"], "not '12x'"),
        (["--budgets", "150%"], "percentage"),
        (["--budgets", "-5"], "negative"),
        (["--tokens", "0"], "--tokens >= 1"),
        (["--rounds", "0"], "--rounds >= 1"),
        (["--ctx", "100", "--prompt-tokens", "0", "--warmup", "60", "--tokens", "60"], "cannot hold 120"),
        (["--ctx", "512", "--prompt-tokens", "500", "--warmup", "8", "--tokens", "8"], "cannot hold 516"),
        (["--prompt-tokens", "-1"], "--prompt-tokens must be >= 0"),
        (["--batch-size", "0"], "number of tokens .>= 1. or auto, not '0'"),
        (["-b", "big"], "number of tokens .>= 1. or auto, not 'big'"),
    ],
)
def test_bad_arguments_say_what_is_wrong(argv: list[str], message: str) -> None:
    with pytest.raises(cf.BenchConfigError, match=message):
        make_plan(_args(*argv))


def test_more_tokens_than_the_text_holds_is_refused() -> None:
    with pytest.raises(cf.BenchConfigError, match="the text holds 50 tokens"):
        make_plan(_args("--prompt-tokens", "0", "--warmup", "16", "--tokens", "64"), n_text_tokens=50)
    with pytest.raises(cf.BenchConfigError, match=r"--prompt-tokens \+ --warmup \+ --tokens = 544"):
        make_plan(_args(), n_text_tokens=543)
    assert make_plan(_args(), n_text_tokens=544).fed == 544


def test_a_prompt_longer_than_a_batch_is_planned_with_its_batch() -> None:
    plan = make_plan(_args("--prompt-tokens", "8192", "--warmup", "2", "--tokens", "4"), n_text_tokens=9000)
    assert plan.fed == 8198 and plan.n_ctx == 8198 and plan.batch == 512 and plan.text_tokens == 8198
    assert make_plan(_args("--prompt-tokens", "2048", "-b", "auto")).batch == "auto"
    assert make_plan(_args("--batch-size", "2048")).batch == 2048
    wide = make_plan(_args("--prompt-tokens", "100", "--tokens", "8", "--warmup", "0", "--parallel", "1,4"))
    assert wide.text_tokens == 4 * 108  # every sequence its own part of the text


def test_the_help_says_what_the_prompt_and_the_memory_limit_do() -> None:
    text = " ".join(parser().format_help().split())
    assert "--prompt-tokens" in text and "0: no prefill measure" in text
    assert (
        "--batch-size" in text and "auto: bmoe's streamed configurations size it from the memory room" in text
    )
    assert "stock (weights repacked into anonymous memory at load) is skipped" in text


def test_budgets_resolve_against_the_experts_and_always_include_the_probe() -> None:
    experts = 4000 * MIB
    configs = cf.build_configs(["stream", "stock"], cf.parse_budgets("0,1536,50%,1536"), experts)
    assert [c.key for c in configs] == ["stock", "stream-0", "stream-1000", "stream-1536", "stream-2000"]
    probe = cf.routing_probe(configs, experts)
    assert probe is not None and probe.cache_mib == 1000 and probe.expert_percent == pytest.approx(25.0)
    assert configs[1].label == "bmoe stream, cache off"


def test_rounds_interleave_the_configurations() -> None:
    a, b = cf.BenchConfig("a", "A", "stock"), cf.BenchConfig("b", "B", "resident")
    assert cf.interleave([a, b], 2) == [(0, a), (0, b), (1, a), (1, b)]


# -- the report ------------------------------------------------------------------------------


def _run(tok_s: float, step_ms: float, *, read: int | None = None, hits: int = 0, misses: int = 0) -> dict:
    r: dict = {
        "tok_s": tok_s,
        "step_ms_median": step_ms,
        "measured_tokens": 10,
        "kernel_read_bytes": 20 * MIB,
        "end": {"VmHWM": 100 * MIB},
        "other_cpu_cores": 0.1,
    }
    if read is not None:
        r["counters"] = {"bytes_read": read, "hits": hits, "misses": misses}
    return r


def test_summary_takes_medians_of_the_rounds_and_skips_failed_ones() -> None:
    config = cf.BenchConfig("stream-100", "S", "stream", cache_mib=100)
    runs = [
        _run(3.0, 300, read=50 * MIB, hits=6, misses=4),
        {"error": "exit status -9 (OOM-killed in the memory group)", "group": {"peak_bytes": 7 * MIB}},
        _run(5.0, 200, read=30 * MIB, hits=8, misses=2),
        _run(4.0, 250, read=40 * MIB, hits=7, misses=3),
    ]
    s = report.summarize(config, runs)
    assert s.tok_s == 4.0
    assert s.step_ms == 250
    assert s.tok_s_rounds == [3.0, None, 5.0, 4.0]
    assert s.mib_per_tok == pytest.approx(4.0)
    assert s.kernel_mib_per_tok == pytest.approx(2.0)
    assert s.hit_rate == pytest.approx(21 / 30)
    assert s.group_peak_bytes == 7 * MIB
    assert s.errors == ["exit status -9 (OOM-killed in the memory group)"]


def test_a_configuration_that_never_ran_is_not_ok() -> None:
    s = report.summarize(cf.BenchConfig("stock", "stock", "stock"), [{"error": "timed out"}])
    assert not s.ok and s.tok_s is None
    assert "failed: timed out" in markdown_table([s])


def test_ratios_to_both_stocks_and_the_disk_ceiling() -> None:
    stock = report.summarize(cf.BenchConfig("stock", "st", "stock"), [_run(0.5, 2000)])
    norepack = report.summarize(cf.BenchConfig("stock-norepack", "sn", "stock-norepack"), [_run(0.25, 4000)])
    stream = report.summarize(
        cf.BenchConfig("stream-0", "s0", "stream", 0), [_run(2.0, 500, read=1000 * MIB)]
    )
    out = report.with_ratios([stock, norepack, stream], bandwidth_mib_s=400.0)
    s = out[2]
    assert s.x_stock == pytest.approx(4.0)
    assert s.x_stock_norepack == pytest.approx(8.0)
    assert s.ceiling_tok_s == pytest.approx(4.0)  # 400 MiB/s over 100 MiB per token
    assert s.of_ceiling == pytest.approx(0.5)
    assert out[0].ceiling_tok_s is None  # stock has no streamer counters


def test_the_ceiling_next_to_each_round_uses_that_rounds_probe() -> None:
    rounds = [
        {**_run(2.0, 500, read=1000 * MIB), "probe_mib_s": 400.0},  # 100 MiB/token: 200 of 400 MiB/s
        {**_run(3.0, 333, read=1000 * MIB), "probe_mib_s": 600.0},  # 300 of 600
        {**_run(1.0, 999, read=1000 * MIB), "probe_mib_s": 125.0},  # 100 of 125
    ]
    s = report.summarize(cf.BenchConfig("stream-0", "s0", "stream", 0), rounds)
    assert s.probe_mib_s == pytest.approx(400.0)
    assert s.of_probe_ceiling == pytest.approx(0.5)  # the median of 0.5, 0.5, 0.8
    plain = report.summarize(cf.BenchConfig("stream-0", "s0", "stream", 0), [_run(2.0, 500, read=MIB)])
    assert plain.probe_mib_s is None and plain.of_probe_ceiling is None
    assert "disk MiB/s next to it" in markdown_table([s])


def test_token_check_finds_the_first_difference() -> None:
    checks = check_tokens(
        {"stock-norepack": [1, 2, 3, 4], "resident": [1, 2, 3, 4], "s": [1, 9, 3, 5]}, "stock-norepack"
    )
    by_key = {c.key: c for c in checks}
    assert by_key["resident"].equal
    assert not by_key["s"].equal and by_key["s"].same == 2 and by_key["s"].first_difference == 1
    assert token_reference({"resident": [], "stock": []}) == "stock"


def test_bmoe_is_compared_with_the_stock_run_whose_weights_have_its_layout() -> None:
    both = {"stock": [1], "stock-norepack": [2], "resident": [1], "stream-0": [1]}
    assert token_reference(both) == "stock"  # bmoe repacks as stock does
    assert token_reference(both, repack=False) == "stock-norepack"
    assert token_reference({"stock-norepack": [2], "resident": [1]}) == "resident"
    assert token_reference({"stock": [1], "resident": [1]}, repack=False) == "resident"
    # under a limit that skips stock and bmoe resident, nothing has the repacked layout
    assert token_reference({"stock-norepack": [2], "stream-0": [1]}) is None


@pytest.mark.parametrize(
    ("hit", "moves"), [(0.42, True), (0.79, True), (0.80, False), (0.97, False), (None, None)]
)
def test_routing_moves_only_well_under_ninety_percent(hit: float | None, moves: bool | None) -> None:
    check = check_routing(hit)
    assert check.moves is moves
    if moves is False:
        assert "barely moves" in check.text()


# -- cgroups ---------------------------------------------------------------------------------

V1_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
"""
V1_CGROUP = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
V2_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"


def test_v1_site_is_this_process_memory_group() -> None:
    assert candidate_sites(V1_MOUNTS, V1_CGROUP) == [
        CgroupSite(1, Path("/sys/fs/cgroup/memory/process_api/abc"))
    ]


def test_v2_site_is_this_process_group() -> None:
    expected = CgroupSite(2, Path("/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"))
    assert candidate_sites(V2_MOUNTS, V2_CGROUP) == [expected]


def test_hybrid_tries_v2_first_then_v1() -> None:
    mounts = V1_MOUNTS + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    sites = candidate_sites(mounts, V1_CGROUP)
    assert [s.version for s in sites] == [2, 1]


def test_no_cgroup_mounted_is_a_clear_error() -> None:
    assert candidate_sites("proc /proc proc rw 0 0\n", "0::/\n") == []
    with pytest.raises(CgroupError, match="mounts none"):
        MemoryGroup.create([], "g", 1 << 30)


def test_unwritable_sites_are_each_explained(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.subtree_control").write_text("cpu io\n")
    missing = tmp_path / "absent" / "deeper"
    with pytest.raises(CgroupError) as err:
        MemoryGroup.create([CgroupSite(2, v2), CgroupSite(1, missing)], "g", 1 << 30)
    text = str(err.value)
    assert "memory controller is not enabled" in text and f"v1 at {missing}: cannot create a group" in text


def test_a_v1_group_writes_its_limit_and_reads_its_figures(tmp_path: Path) -> None:
    group = MemoryGroup.create([CgroupSite(1, tmp_path)], "g", 256 * MIB)  # a plain folder stands in
    assert (tmp_path / "g" / "memory.limit_in_bytes").read_text() == str(256 * MIB)
    (tmp_path / "g" / "memory.max_usage_in_bytes").write_text("12345\n")
    (tmp_path / "g" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert group.peak_bytes() == 12345 and group.oom_kills() == 2


def test_proc_io_parses_read_bytes() -> None:
    text = "rchar: 10\nwchar: 2\nsyscr: 1\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
    assert parse_io(text)["read_bytes"] == 4096


# -- teacher forcing -------------------------------------------------------------------------


class FakeStepper:
    """Greedy choice = the fed token + 1; each step takes one tick of the fake clock."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.fed: list[tuple[int, int]] = []

    def step(self, token: int, pos: int) -> None:
        self.fed.append((token, pos))
        self.clock[0] += 1.0

    def argmax(self) -> int:
        return self.fed[-1][0] + 1


def test_teacher_forcing_feeds_the_sequence_and_times_only_the_measure() -> None:
    clock = [0.0]
    stepper = FakeStepper(clock)
    started: list[int] = []
    d = teacher_force(
        stepper,
        [10, 11, 12, 13, 14, 15],
        warmup=2,
        measure=3,
        on_measure_start=lambda: started.append(len(stepper.fed)),
        clock=lambda: clock[0],
    )
    assert stepper.fed == [(10, 0), (11, 1), (12, 2), (13, 3), (14, 4)]
    assert started == [2]
    assert d.argmax == [11, 12, 13, 14, 15]
    assert d.measured == 3 and d.warmup == 2 and d.tok_s == pytest.approx(1.0)


def test_teacher_forcing_stops_at_the_time_cap_and_says_so() -> None:
    clock = [0.0]
    d = teacher_force(FakeStepper(clock), list(range(20)), 0, 10, max_seconds=2.5, clock=lambda: clock[0])
    assert d.measured == 3
    assert d.notes == ["measure cut at 3 of 10 tokens by the time cap (2.5 s)"]


def test_teacher_forcing_refuses_more_than_the_sequence() -> None:
    with pytest.raises(ValueError, match="holds 3"):
        teacher_force(FakeStepper([0.0]), [1, 2, 3], 2, 2)


def test_tokens_after_prompts_prefilled_in_other_batches_are_compared_but_not_required_equal() -> None:
    from bmoe.bench.main import exit_status

    argmax = {"resident": [1, 2, 3], "stream-0": [1, 2, 4], "stream-9": [1, 5, 3]}
    checks = check_tokens(argmax, "resident", {"resident": 512, "stream-0": 1664, "stream-9": 512})
    by_key = {c.key: c for c in checks}
    assert by_key["stream-0"].ubatches == (1664, 512) and not by_key["stream-0"].required
    assert by_key["stream-9"].ubatches is None and by_key["stream-9"].required
    assert exit_status([], [by_key["stream-0"]]) == 0  # differs, after other batches
    assert exit_status([], [by_key["stream-9"]]) == 1  # differs at the same batch
    lines = summary_lines([], checks, check_routing(None), rounds=1)
    assert (
        "- stream-0: 2 of 3 greedy tokens as resident, first difference at position 2 (its prompt "
        "prefilled in batches of 1664 against 512: not required equal)"
    ) in lines


def test_exit_status_fails_on_bmoe_failures_and_token_differences_not_on_stock_ooms() -> None:
    from bmoe.bench.main import exit_status

    stock_oom = report.summarize(cf.BenchConfig("stock", "st", "stock"), [{"error": "OOM-killed"}])
    stream = report.summarize(cf.BenchConfig("stream-0", "s0", "stream", 0), [_run(2.0, 500, read=MIB)])
    same = TokenCheck("stream-0", "stock-norepack", 8, 8, None)
    differs = TokenCheck("stream-0", "stock-norepack", 7, 8, 3)
    assert exit_status([stock_oom, stream], [same]) == 0
    assert exit_status([stock_oom, stream], [differs]) == 1
    failed = report.summarize(cf.BenchConfig("stream-0", "s0", "stream", 0), [{"error": "exit status 1"}])
    assert exit_status([failed], []) == 1


def test_bench_model_size_sets_the_layers_and_is_written_once(tmp_path: Path) -> None:
    from bmoe.bench.model import cached_bench_model, file_bytes, shape_for_size
    from bmoe.tinymodel.synthetic import SyntheticShape

    assert shape_for_size(5.6).n_layer == 16  # the Qwen3-30B-like default, 5.63 GB
    assert shape_for_size(0.01).n_layer == 1
    base = SyntheticShape(n_layer=1, n_embd=64, n_ff_exp=32, n_expert=4, n_expert_used=2, head_dim=32)
    three = file_bytes(attrs.evolve(base, n_layer=3))
    shape = shape_for_size(three / 1e9, base)
    assert shape.n_layer == 3
    path = cached_bench_model(shape, root=tmp_path)
    stamp = path.stat().st_mtime_ns
    assert cached_bench_model(shape, root=tmp_path) == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_prefetch_depths_run_beside_each_cache_budget_but_not_with_the_cache_off() -> None:
    experts = 4096 * cf.MIB
    configs = cf.build_configs(["stream"], [cf.Budget(mib=0), cf.Budget(mib=1024)], experts, (1, 2))
    keys = [c.key for c in configs]
    assert keys == ["stream-0", "stream-1024", "stream-1024-prefetch1", "stream-1024-prefetch2"]
    assert [c.stream_kwargs().get("prefetch", 0) for c in configs] == [0, 0, 1, 2]
    assert cf.parse_prefetch("2,1,2") == (2, 1)
    with pytest.raises(cf.BenchConfigError):
        cf.parse_prefetch("0")


def test_routing_policies_run_beside_each_cache_budget_with_their_settings() -> None:
    experts = 4096 * cf.MIB
    policies = cf.parse_policies("predict, route-ahead=2,drop=0.75,substitute=0.05,predict")
    assert [p.key for p in policies] == ["predict", "route-ahead2", "drop0.75", "substitute0.05"]
    configs = cf.build_configs(["stream"], [cf.Budget(mib=0), cf.Budget(mib=1024)], experts, (1,), policies)
    keys = [c.key for c in configs]
    assert keys[:3] == ["stream-0", "stream-1024", "stream-1024-prefetch1"]
    assert [c.stream_kwargs() for c in configs[2:]] == [
        {"prefetch": 1},
        {"predict_prefetch": True},
        {"route_ahead": 2},
        {"drop_cold": 0.75},
        {"substitute": 0.05},
    ]
    assert configs[4].label.endswith("--route-ahead 2")
    for bad in ("predict=1", "route-ahead", "warp=2", "drop=x"):
        with pytest.raises(cf.BenchConfigError):
            cf.parse_policies(bad)


def test_a_routing_policy_is_checked_against_its_budget_without_it() -> None:
    experts = 4096 * cf.MIB
    policies = cf.parse_policies("route-ahead=1")
    configs = cf.build_configs(["stream"], [cf.Budget(mib=1024)], experts, (), policies)
    runs = {
        c.key: [{"argmax": [1, 2, 3, 4] if "route" not in c.key else [1, 2, 9, 4], "tok_s": 1.0,
                 "measured_tokens": 4, "step_ms_median": 1.0}]
        for c in configs
    }  # fmt: skip
    outcome = report.conclude(configs, runs, experts, 1000.0)
    check = next(t for t in outcome.checks if t.key == "stream-1024-route-ahead1")
    assert (check.reference, check.same, check.compared, check.first_difference) == ("stream-1024", 3, 4, 2)


def test_random_reads_read_what_they_were_asked_at_distinct_offsets(tmp_path: Path) -> None:
    from bmoe.bench.disk import measure_random_reads

    f = tmp_path / "blob"
    f.write_bytes(bytes(8 * MIB))
    bw = measure_random_reads(f, 5 * MIB, block=MIB, n_lanes=2, seed=3)
    assert (bw.bytes, bw.lanes) == (5 * MIB, 2) and bw.seconds > 0
    assert measure_random_reads(f, 64 * MIB, block=MIB, n_lanes=3).bytes == 8 * MIB  # at most the file


# -- the prefill -----------------------------------------------------------------------------


class FakePrefiller:
    """Records each prefill; a prefill of n tokens takes n / 100 s of the fake clock."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.prefilled: list[list[int]] = []
        self.seqs: list[int] = []

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        self.prefilled.append(list(tokens))
        self.seqs.append(seq)
        self.clock[0] += len(tokens) / 100


def test_the_prefill_takes_the_prompt_in_one_call_and_times_it() -> None:
    clock = [5.0]
    stepper = FakePrefiller(clock)
    done = timed_prefill(stepper, list(range(40)), clock=lambda: clock[0])
    assert stepper.prefilled == [list(range(40))]
    assert done.tokens == 40 and done.seconds == pytest.approx(0.4) and done.tok_s == pytest.approx(100.0)


def test_a_prefill_takes_at_least_one_token_and_any_length_past_a_batch() -> None:
    stepper = FakePrefiller([0.0])
    with pytest.raises(ValueError, match="at least one token"):
        timed_prefill(stepper, [])
    assert stepper.prefilled == []
    timed_prefill(stepper, [7] * (4 * PREFILL_BATCH + 1))  # the stepper takes it in its batches
    assert [len(p) for p in stepper.prefilled] == [4 * PREFILL_BATCH + 1]


def test_after_a_prefill_the_decode_continues_the_same_sequence_at_its_end() -> None:
    clock = [0.0]
    stepper = FakeStepper(clock)
    tokens = [10, 11, 12, 13, 14, 15, 16, 17]
    done: list[int] = []
    d = teacher_force(
        stepper, tokens, warmup=1, measure=2, start=4, on_token=done.append, clock=lambda: clock[0]
    )
    assert stepper.fed == [(14, 4), (15, 5), (16, 6)]  # the prompt's 4 tokens are not fed again
    assert d.argmax == [15, 16, 17] and d.warmup == 1 and d.measured == 2
    assert done == [1, 2, 3]  # decode steps; the child adds the prompt for its progress lines
    with pytest.raises(ValueError, match="4 \\+ 2 \\+ 3 tokens asked, the sequence holds 8"):
        teacher_force(FakeStepper([0.0]), tokens, 2, 3, start=4)


def _prefilled(r: dict, tok_s: float, *, read: int | None = None, stall: float | None = None) -> dict:
    """``r`` (a round from ``_run``) with a prefill of 400 tokens at ``tok_s``."""
    out = {**r, "prompt_tokens": 400, "prefill_tok_s": tok_s, "prefill_s": 400 / tok_s, "prefill_ubatch": 512}
    out["prefill_kernel_read_bytes"] = 300 * MIB
    if read is not None:
        out["prefill_read_bytes"] = read
        out["prefill_landed_bytes"] = read - 100 * MIB  # some planned reads were cancelled
        out["prefill_stall_s"] = stall
    return out


def test_prefill_figures_are_medians_of_the_rounds_that_finished() -> None:
    config = cf.BenchConfig("stream-100", "S", "stream", cache_mib=100)
    runs = [
        _prefilled(_run(3.0, 300, read=MIB), 40.0, read=900 * MIB, stall=2.0),
        {"error": "timed out"},
        _prefilled(_run(5.0, 200, read=MIB), 80.0, read=700 * MIB, stall=1.0),
        _prefilled(_run(4.0, 250, read=MIB), 50.0, read=800 * MIB, stall=3.0),
    ]
    s = report.summarize(config, runs)
    assert s.prompt_tokens == 400
    assert s.prefill_tok_s == 50.0 and s.prefill_tok_s_rounds == [40.0, None, 80.0, 50.0]
    assert s.prefill_s == pytest.approx(8.0)  # the median of 10, 5 and 8 s
    assert s.prefill_read_mib == pytest.approx(800.0) and s.prefill_stall_s == pytest.approx(2.0)
    assert s.prefill_landed_mib == pytest.approx(700.0)
    assert s.prefill_kernel_read_mib == pytest.approx(300.0)
    assert s.tok_s == 4.0  # the decode's figures are the decode's alone
    lines = summary_lines([s], [], check_routing(None), rounds=4)
    assert "- S: prefill tok/s of the 4 rounds 40.00, failed, 80.00, 50.00" in lines
    assert "- S: decode tok/s of the 4 rounds 3.00, failed, 5.00, 4.00" in lines
    reads = (
        "- S: the prefill of 400 tokens in batches of 512 planned 800 MiB of reads (bmoe's counters), "
        "700 MiB landed (the rest cancelled while queued), the compute waited 2.00 s for reads (medians "
        "of the rounds)"
    )
    assert reads in lines
    passes = report.with_passes(s, 400 * MIB)
    assert passes.prefill_passes == pytest.approx(2.0)
    lines = summary_lines([passes], [], check_routing(None), rounds=4)
    assert any("planned 800 MiB of reads (bmoe's counters, the experts 2.00 times over)" in x for x in lines)
    row = markdown_table([passes]).splitlines()[2]
    assert "| 512 | 2.00 |" in row  # the prompt batch and the passes columns


def test_without_a_prefill_there_are_no_prefill_figures() -> None:
    s = report.summarize(cf.BenchConfig("resident", "R", "resident"), [_run(2.0, 500)])
    assert s.prompt_tokens == 0 and s.prefill_tok_s is None and s.prefill_tok_s_rounds == [None]
    assert report.stock_baseline([s]) == report.StockBaseline(None)
    [row] = markdown_table([s]).splitlines()[2:]
    assert row.startswith("| R | 2.00 | 500.0 |  |  |")  # decode, step, then empty prefill cells


def _stocks_and_stream(stock: list[dict], skipped: str | None = None) -> list[report.Summary]:
    return [
        report.summarize(cf.BenchConfig("stock", "st", "stock"), stock, skipped),
        report.summarize(
            cf.BenchConfig("stock-norepack", "sn", "stock-norepack"), [_prefilled(_run(0.25, 4000), 20.0)]
        ),
        report.summarize(
            cf.BenchConfig("stream-0", "s0", "stream", 0),
            [_prefilled(_run(2.0, 500, read=1000 * MIB), 60.0, read=2000 * MIB, stall=1.0)],
        ),
    ]


def test_the_prefill_ratio_is_against_stock_in_the_same_run() -> None:
    out = report.with_ratios(_stocks_and_stream([_prefilled(_run(0.5, 2000), 30.0)]), 400.0)
    stock, norepack, stream = out
    assert stream.prefill_x_stock == pytest.approx(2.0) and norepack.prefill_x_stock == pytest.approx(2 / 3)
    assert stock.prefill_x_stock == pytest.approx(1.0)
    assert stream.x_stock == pytest.approx(4.0)  # the decode's ratio is unchanged
    baseline = report.stock_baseline(out)
    assert baseline == report.StockBaseline("stock", "st") and baseline.text() is None
    table = markdown_table(out)
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert head[:3] == ["configuration", "decode tok/s", "median decode step ms"]
    assert head[3:5] == ["prefill tok/s", "prefill x stock"]
    assert "| s0 | 2.00 | 500.0 | 60.00 | 2.00 |" in table


def test_a_skipped_stock_is_listed_with_its_reason_and_the_ratio_falls_back_to_norepack() -> None:
    reason = "llama.cpp's default load repacks the weights into 5.2 GiB of anonymous memory, more than ..."
    out = report.with_ratios(_stocks_and_stream([], skipped=reason), 400.0)
    stock, _, stream = out
    assert not stock.ok and stock.skipped == reason and stock.tok_s is None
    assert stream.prefill_x_stock == pytest.approx(3.0)  # 60 over stock-norepack's 20
    assert stream.x_stock is None and stream.x_stock_norepack == pytest.approx(8.0)
    baseline = report.stock_baseline(out)
    assert (baseline.key, baseline.stock_state) == ("stock-norepack", "skipped")
    assert baseline.stock_skipped == reason
    table = markdown_table(out, baseline)
    assert "prefill x stock-norepack (stock skipped)" in table.splitlines()[0]
    assert f"| st | skipped: {reason} |" in table and "failed" not in table
    lines = summary_lines(out, [], check_routing(None), 1, baseline)
    assert f"- prefill x stock: against sn, since stock was skipped ({reason})" in lines
    assert f"- st: skipped: {reason}" in lines


def test_a_failed_or_absent_stock_also_falls_back_and_says_which() -> None:
    failed = report.with_ratios(_stocks_and_stream([{"error": "exit status -9"}]), 400.0)
    assert report.stock_baseline(failed).column() == "prefill x stock-norepack (stock failed)"
    absent = report.with_ratios(_stocks_and_stream([])[1:], 400.0)
    assert report.stock_baseline(absent).column() == "prefill x stock-norepack (stock not run)"
    assert absent[1].prefill_x_stock == pytest.approx(3.0)
    alone = report.with_ratios(_stocks_and_stream([])[2:], 400.0)
    assert alone[0].prefill_x_stock is None
    assert report.stock_baseline(alone).text() == (
        "prefill x stock: no stock prefill to divide by: stock was not run, and stock-norepack has none"
    )


def test_conclude_reports_the_skipped_configurations_without_rounds() -> None:
    configs = cf.build_configs(["stock", "stock-norepack", "stream"], [cf.Budget(mib=0)], 4 * MIB)
    same = {"argmax": [1, 2, 3]}
    runs = {
        "stock": [],
        "stock-norepack": [{**_prefilled(_run(1.0, 1000), 10.0), **same}],
        "stream-0": [{**_prefilled(_run(2.0, 500, read=MIB), 30.0, read=MIB, stall=0.0), **same}],
        "stream-1": [{**_prefilled(_run(2.0, 500, read=MIB), 20.0, read=MIB, stall=0.0), **same}],
    }
    outcome = report.conclude(configs, runs, 4 * MIB, 400.0, {"stock": "too big"})
    by_key = {s.key: s for s in outcome.summaries}
    assert by_key["stock"].skipped == "too big" and by_key["stream-0"].skipped is None
    assert outcome.baseline.key == "stock-norepack"
    assert by_key["stream-0"].prefill_x_stock == pytest.approx(3.0)
    assert outcome.checks == []  # nothing ran with bmoe's repacked layout to compare with
    lines = summary_lines(outcome.summaries, outcome.checks, outcome.routing, 1)
    assert (
        "- greedy tokens not compared: no stock or bmoe resident run has the streamed runs' "
        "weight layout (the gates check streamed == resident bit for bit)" in lines
    )
    unpacked = report.conclude(configs, runs, 4 * MIB, 400.0, {"stock": "too big"}, repack=False)
    assert [t.key for t in unpacked.checks] == ["stream-0", "stream-1"]
    assert all(t.equal and t.reference == "stock-norepack" for t in unpacked.checks)


def test_a_rounds_progress_line_gives_its_prefill_and_its_decode() -> None:
    from bmoe.bench.main import finished_text

    r = _prefilled(_run(2.5, 400), 123.4)
    text = "prefill 123.40 tok/s over 400 tokens in batches of 512, decode 2.50 tok/s over 10 tokens"
    assert finished_text(r) == text
    assert finished_text(_run(2.5, 400)) == "decode 2.50 tok/s over 10 tokens"


# -- the memory limit ------------------------------------------------------------------------


def test_stock_is_skipped_when_the_model_is_larger_than_the_limit() -> None:
    reason = repack_skip_reason(5_630_000_000, 2048)
    assert reason == (
        "llama.cpp's default load repacks the weights into 5.2 GiB of anonymous memory, more than the "
        "2048 MiB limit (run stock-norepack, or raise --mem-limit-mb)"
    )
    small = repack_skip_reason(600 * MIB, 512)
    assert small is not None and "into 600.0 MiB of anonymous memory, more than the 512 MiB limit" in small
    assert repack_skip_reason(5_630_000_000, 0) is None  # no limit
    assert repack_skip_reason(2048 * MIB, 2048) is None  # exactly the limit: it may fit
    assert repack_skip_reason(2048 * MIB + 1, 2048) is not None


def test_only_the_repacking_loads_are_skipped_not_the_mmap_ones() -> None:
    configs = cf.build_configs(list(cf.KINDS), [cf.Budget(mib=0)], 4000 * MIB)
    skipped = skipped_configs(configs, 5_630_000_000, 2048)
    assert list(skipped) == ["stock", "resident"]
    assert skipped["stock"].startswith("llama.cpp's default load repacks")
    assert skipped["resident"] == (
        "bmoe resident, as llama.cpp's default load, repacks the weights into 5.2 GiB of anonymous memory, "
        "more than the 2048 MiB limit (run the bench with --no-repack, or raise --mem-limit-mb)"
    )
    assert list(skipped_configs(configs, 5_630_000_000, 2048, bmoe_repack=False)) == ["stock"]
    assert skipped_configs(configs, 5_630_000_000, 8192) == {}
    no_stock = [c for c in configs if c.kind not in ("stock", "resident")]
    assert skipped_configs(no_stock, 5_630_000_000, 2048) == {}  # no repacking load asked


def test_resident_runs_outside_the_limit_where_a_streamed_step_needs_its_bound() -> None:
    """Skipped in the group, resident would leave the streamed rows without the compute their
    step is held to: it runs outside the memory group instead (the throttle still holds it);
    stock stays skipped, and with no streamed configuration resident does too."""
    configs = cf.build_configs(["stock", "resident", "stream"], [cf.Budget(mib=1536)], 4000 * MIB)
    skipped = skipped_configs(configs, 5_630_000_000, 2048)
    assert outside_the_limit(configs, skipped) == {"resident": UNCONFINED_NOTE}
    no_stream = [c for c in configs if not c.streams]
    assert outside_the_limit(no_stream, skipped_configs(no_stream, 5_630_000_000, 2048)) == {}


def test_a_skipped_stock_does_not_fail_the_bench() -> None:
    from bmoe.bench.main import exit_status

    skipped = report.summarize(cf.BenchConfig("stock", "st", "stock"), [], "too big")
    stream = report.summarize(cf.BenchConfig("stream-0", "s0", "stream", 0), [_run(2.0, 500, read=MIB)])
    assert exit_status([skipped, stream], [TokenCheck("stream-0", "stock-norepack", 8, 8, None)]) == 0


def test_the_stale_gate_with_more_reads_a_layer_is_a_policy_of_its_own() -> None:
    (policy,) = cf.parse_policies("predict-spec=4")
    assert policy.key == "predict-spec4"
    assert policy.flag == "--predict-prefetch --predict-spec-max 4"
    assert policy.stream_kwargs() == {"predict_prefetch": True, "predict_spec_max": 4}
    with pytest.raises(cf.BenchConfigError):
        cf.parse_policies("predict-spec")


def test_a_deeper_stale_gate_is_a_policy_of_its_own() -> None:
    (policy,) = cf.parse_policies("predict-depth=2")
    assert policy.key == "predict-depth2"
    assert policy.stream_kwargs() == {"predict_prefetch": True, "predict_depth": 2}


def test_the_routing_probes_budget_runs_without_the_policies_when_only_the_probe_asks_for_it() -> None:
    experts = 4096 * cf.MIB
    policies = cf.parse_policies("predict")
    configs = cf.build_configs(["stream"], [cf.Budget(percent=90.0)], experts, (), policies)
    assert [c.key for c in configs] == ["stream-1024", "stream-3686", "stream-3686-predict"]
