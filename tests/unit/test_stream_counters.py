"""The activity between two counter snapshots: every count subtracted, sizes kept from the
later snapshot, per-layer prediction counts subtracted layer by layer."""

from __future__ import annotations

import attrs

from bmoe.domain.generation import RunResult
from bmoe.domain.streaming import StreamCounters, StreamReport
from bmoe.domain.summary import stream_lines


def test_a_difference_subtracts_every_count_and_keeps_the_sizes() -> None:
    names = [f.name for f in attrs.fields(StreamCounters)]
    layered = {"predict_layers", "stall_layers"}
    later = StreamCounters(
        **{n: 10 for n in names if n not in layered},
        predict_layers=((5, 3), (2, 1)),
        stall_layers=(0.5, 0.25),
    )
    earlier = StreamCounters(
        **{n: 4 for n in names if n not in layered},
        predict_layers=((1, 1), (1, 0)),
        stall_layers=(0.25, 0.0),
    )
    delta = later - earlier
    for name in names:
        expected = {
            "resident_bytes": 10,
            "budget_bytes": 10,
            "rank_worker": 10,  # a state, kept from the later snapshot
            "cache_rule": 10,  # the rule in charge: a state too
            "cache_victims": 10,  # --cache-victims in force: a state
            "predict_layers": ((4, 2), (1, 1)),
            "stall_layers": (0.25, 0.25),
        }.get(name, 6)
        assert getattr(delta, name) == expected, name
    assert (later - StreamCounters()).predict_layers == ((5, 3), (2, 1))  # no layers before: as is
    assert (later - StreamCounters()).stall_layers == (0.5, 0.25)


def test_decisions_zero_the_mechanism_and_keep_what_the_policy_decided() -> None:
    c = StreamCounters(
        hits=7, misses=3, evictions=2, bytes_read=99, io_s=0.5, stall_s=0.25, mgmt_s=0.1,
        release_s=0.01, release_lanes_s=0.02, releases_deferred=2, releases_cancelled=1,
        rank_s=0.3, issue_s=0.4, evict_waits=3, evict_wait_s=0.05, reads_orphaned=4, orphans_cut=2,
    )  # fmt: skip
    d = c.decisions()
    assert (d.hits, d.misses, d.evictions, d.bytes_read) == (7, 3, 2, 99)
    assert (d.io_s, d.stall_s, d.mgmt_s, d.release_s, d.release_lanes_s, d.rank_s, d.issue_s) == (0.0,) * 7
    assert (d.releases_deferred, d.releases_cancelled) == (0, 0)
    assert (d.evict_waits, d.evict_wait_s, d.reads_orphaned, d.orphans_cut) == (0, 0.0, 0, 0)


def test_the_cache_line_says_where_evicted_pages_went_back() -> None:
    decode = StreamCounters(hits=9, misses=3, evictions=4, release_s=0.004, release_lanes_s=0.002)
    report = StreamReport(prefill=StreamCounters(), decode=decode, decode_steps=2, decode_wall_s=0.2)
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    lines = stream_lines(result)
    assert (
        "evicted pages moved or given back in 2.00 ms/token on the eval thread + 1.00 on the lanes"
        in (lines[1])
    )


def test_the_kernel_line_gives_system_time_and_faults_per_token_and_for_the_prefill() -> None:
    prefill = StreamCounters(minor_faults=37_492, system_s=0.296)
    decode = StreamCounters(hits=9, misses=3, minor_faults=6, system_s=0.0004)
    report = StreamReport(prefill=prefill, decode=decode, decode_steps=2, decode_wall_s=0.2)
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    assert stream_lines(result)[2] == (
        "moe-kernel: system time 0.20 ms/token and 3 minor page faults/token in decode; "
        "the prefill 0.30 s and 37,492 faults (the process's, every thread)"
    )
    quiet = StreamReport(prefill=StreamCounters(), decode=StreamCounters(), decode_steps=2, decode_wall_s=0.2)
    lines = stream_lines(attrs.evolve(result, stream=quiet))
    assert not any(line.startswith("moe-kernel:") for line in lines)


def test_the_cache_line_counts_the_passed_layer_calls() -> None:
    report = StreamReport(
        prefill=StreamCounters(passed=4),
        decode=StreamCounters(hits=8, passed=12),
        decode_steps=2,
        decode_wall_s=0.2,
    )
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    assert (
        "; 16 layer calls passed (the layer cached whole: no request, no graph stop)"
        in stream_lines(result)[1]
    )


def test_the_counters_difference_carries_the_process_figures() -> None:
    before = StreamCounters(minor_faults=10, system_s=1.0)
    after = StreamCounters(minor_faults=25, system_s=1.5)
    assert ((after - before).minor_faults, (after - before).system_s) == (15, 0.5)
    assert (after.decisions().minor_faults, after.decisions().system_s) == (0, 0.0)


def test_the_cache_line_counts_evictions_under_a_running_read() -> None:
    decode = StreamCounters(
        hits=9, misses=3, evictions=4, reads_orphaned=3, orphans_cut=2, evict_waits=1, evict_wait_s=0.01
    )
    report = StreamReport(prefill=StreamCounters(), decode=decode, decode_steps=2, decode_wall_s=0.2)
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    line = stream_lines(result)[1]
    assert "3 evicted while being read (2 of those reads cut short)" in line
    assert "1 evictions waited for their read to end (5.00 ms/token)" in line


def _prefetch_line(prefill: StreamCounters, decode: StreamCounters) -> list[str]:
    report = StreamReport(prefill=prefill, decode=decode, decode_steps=2, decode_wall_s=0.2)
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    return [line for line in stream_lines(result) if line.startswith("moe-prefetch:")]


def test_the_prefetch_line_says_whose_reads_ahead_and_nothing_without_any() -> None:
    assert _prefetch_line(StreamCounters(warm_issued=32), StreamCounters(hits=32)) == []  # a warm-up only
    (line,) = _prefetch_line(
        StreamCounters(prefetch_issued=17, prefetch_hits=7, prefetch_wasted=10), StreamCounters()
    )
    assert line == (
        "moe-prefetch: 17 experts read ahead (by the prefill: a batch routing half a layer's experts "
        "reads the next layer whole), 7 used (41.2%), 10 evicted unused"
    )
    (line,) = _prefetch_line(
        StreamCounters(prefetch_issued=4), StreamCounters(prefetch_issued=6, prefetch_hits=5)
    )
    assert line.startswith(
        "moe-prefetch: 10 experts read ahead (4 by the prefill, 6 in decode), 5 used (50.0%)"
    )


def test_the_engine_reports_every_counter_under_its_field_name() -> None:
    """Counters named once: the C streamer's reports carry ``StreamCounters``' field names,
    so the adapter keeps them without renaming any (``StreamCounters.of``); only the
    process's own figures (getrusage) and the victims' chooser's switches (the runtime's)
    come from elsewhere."""
    from bmoe.cext.expert_stream import ExpertStreamer

    streamer = ExpertStreamer(n_layer=2, n_expert=4, n_proj=1)
    reported = {**streamer.stats(), **streamer.routing_stats()}
    elsewhere = {"minor_faults", "system_s", "victims_switches"}
    assert {f.name for f in attrs.fields(StreamCounters)} - elsewhere <= set(reported)
    counters = StreamCounters.of(reported)
    assert counters.budget_bytes == reported["budget_bytes"] and counters.stall_layers == (0.0, 0.0)
    assert StreamCounters.of({"hits": 3, "topk_stops": 9}) == StreamCounters(hits=3)


def test_the_cache_line_names_the_rule_in_charge_and_the_ghosts_hit_rates() -> None:
    before = StreamCounters(cache_rule="lfu", rule_switches=1, ghost_wanted=100, ghost_lru_hits=50)
    after = StreamCounters(
        hits=9, misses=3, cache_rule="lru", rule_switches=3,
        ghost_wanted=300, ghost_lru_hits=150, ghost_slru_hits=100, ghost_lfu_hits=80,
    )  # fmt: skip
    report = StreamReport(prefill=before, decode=after - before, decode_steps=2, decode_wall_s=0.2)
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    assert stream_lines(result)[1].endswith(
        "; evicting by lru (adaptive, 2 switches; ghosts hit lru 50.0%, slru 50.0%, lfu 40.0%)"
    )
    fixed = StreamReport(
        prefill=StreamCounters(),
        decode=StreamCounters(hits=1, cache_rule="slru"),
        decode_steps=1,
        decode_wall_s=0.1,
    )
    assert stream_lines(attrs.evolve(result, stream=fixed))[1].endswith("; evicting by slru")


def test_the_cache_line_says_where_misses_took_their_victims_rows() -> None:
    report = StreamReport(
        prefill=StreamCounters(cache_victims="layer"),
        decode=StreamCounters(hits=4, misses=2, cache_rule="lfu", cache_victims="layer", rows_swapped=2),
        decode_steps=2,
        decode_wall_s=0.2,
    )
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    assert stream_lines(result)[1].endswith(
        "; evicting by lfu; victims from the missing layer (2 read into their victim's row)"
    )
    assert StreamCounters(rows_swapped=5).decisions() == StreamCounters()  # the mechanism's


def test_the_cache_line_names_the_victims_scope_chosen_and_what_its_twin_missed_and_moved() -> None:
    decode = StreamCounters(
        hits=90, misses=10, cache_rule="lfu", cache_victims="layer", cross_evictions=1,
        twin_misses=8, twin_cross_evictions=9, victims_switches=1,
    )  # fmt: skip
    report = StreamReport(prefill=StreamCounters(), decode=decode, decode_steps=2, decode_wall_s=0.2)
    result = RunResult("", "", (), n_prompt=1, n_past=3, prefill_s=0.1, decode_s=0.2, stream=report)
    assert stream_lines(result)[1].endswith(
        "; victims' scope by cost (auto): layer now, 1 switch; under the other scope 8 misses, "
        "9 page moves (this cache 10, 1)"
    )
