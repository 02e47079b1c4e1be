"""The streaming policy executed through the expert-source port, on the fake source: what
the graph would read, what is read once, and faults that stay fatal."""

from __future__ import annotations

import errno

import pytest

from bmoe.domain.streaming import GraphFault, ReadFault
from bmoe.domain.streaming.prefetch import PreviousTokenPrefetch, next_moe_layer, prefill_reads_ahead
from bmoe.errors import ExpertGraphError, ExpertReadError, StreamingFaultError
from bmoe.service.expert_streaming import PolicyStreaming
from bmoe.testing.fake_expert_source import FakeExpertSource

SIZES = [64, 0, 96]  # layer 1 has no routed experts; layer 2's entries are bigger


def streaming(budget: int = 10_000, **kw: object) -> tuple[PolicyStreaming, FakeExpertSource]:
    source = FakeExpertSource(SIZES, 8, **kw)  # type: ignore[arg-type]
    return PolicyStreaming(source, budget), source


def test_every_routed_expert_is_in_memory_when_route_returns() -> None:
    s, src = streaming()
    s.route(0, [3, 5, 3])
    s.route(2, [1])
    for entry in [(0, 3), (0, 5), (2, 1)]:
        assert src.read_back(entry) == src.file_bytes(entry)
    assert src.read_back((0, 4)) == bytes(64)  # never routed: zeros
    assert src.reads == [(0, 3), (0, 5), (2, 1)]


def test_hits_are_not_read_again_and_evicted_entries_are_released() -> None:
    s, src = streaming(budget=64 + 96)
    s.route(0, [1])
    s.route(2, [1])
    s.route(0, [1])  # hit
    assert src.reads == [(0, 1), (2, 1)]
    s.route(0, [2])  # evicts (2, 1): the oldest not wanted
    assert src.read_back((2, 1)) == bytes(96)
    assert s.resident() == [(0, 1), (0, 2)]
    c = s.counters()
    assert (c.requests, c.hits, c.misses, c.evictions, c.bytes_read) == (4, 1, 3, 1, 64 + 96 + 64)


def test_an_issued_read_is_adopted_by_the_load_not_done_twice() -> None:
    src = FakeExpertSource(SIZES, 8, latency=0.010, lanes=1)
    src.issue([(0, 6)])
    src.advance(0.004)  # compute ran for 4 ms while the read progressed
    waited = src.load([(0, 6)])
    assert src.reads == [(0, 6)]
    assert waited == pytest.approx(0.006)


def test_cancel_drops_only_reads_that_have_not_started() -> None:
    src = FakeExpertSource(SIZES, 8, latency=0.010, lanes=1)
    src.issue([(0, 1), (0, 2)])
    src.advance(0.005)  # (0, 1) has started
    assert src.cancel([(0, 1), (0, 2)]) == 1
    assert src.in_flight() == [(0, 1)]


def test_eintr_storms_are_retried_not_faults() -> None:
    s, src = streaming()
    src.eintr_storm(1000)
    s.route(0, [1, 2])
    assert s.fault() is None and src.eintr_retries == 1000
    assert src.read_back((0, 2)) == src.file_bytes((0, 2))


@pytest.mark.parametrize(
    ("inject", "err"),
    [
        (lambda src: src.fail_entry((0, 2)), errno.EIO),
        (lambda src: src.fail_entry((0, 2), errno.ENXIO), errno.ENXIO),
        (lambda src: src.short_read((0, 2)), errno.EIO),
        (lambda src: src.replace_file(), errno.ESTALE),
    ],
)
def test_a_read_fault_is_raised_named_and_sticky(inject: object, err: int) -> None:
    s, src = streaming()
    s.route(0, [1])
    inject(src)  # type: ignore[operator]
    with pytest.raises(ExpertReadError, match=r"expert read failed: fake.gguf at offset \d+") as first:
        s.route(0, [2])
    fault = s.fault()
    assert isinstance(fault, ReadFault) and fault.errno == err
    assert fault.offset == src.offset((0, 2))
    n_reads = len(src.reads)
    for layer, ids in [(0, [1]), (2, [5]), (0, [7])]:  # hits and misses alike
        with pytest.raises(ExpertReadError) as again:
            s.route(layer, ids)
        assert str(again.value) == str(first.value)
    assert len(src.reads) == n_reads  # a faulted source reads nothing more


def test_a_routing_the_policy_cannot_serve_is_a_sticky_graph_fault() -> None:
    s, src = streaming()
    with pytest.raises(ExpertGraphError, match="layer 1"):
        s.route(1, [0])  # a layer with no known experts: never a silent return
    assert isinstance(s.fault(), GraphFault)
    with pytest.raises(StreamingFaultError):
        s.route(0, [0])
    assert src.reads == []


def test_budget_changes_release_what_they_evict() -> None:
    s, src = streaming()
    s.route(0, [1, 2])
    s.route(2, [3])
    assert s.set_budget(96) == ((0, 1), (0, 2))
    assert src.read_back((0, 1)) == bytes(64) and src.read_back((2, 3)) == src.file_bytes((2, 3))
    assert s.evict_all() == ((2, 3),)
    assert src.memory == {}


def test_a_closed_source_refuses_reads() -> None:
    s, src = streaming()
    src.close()
    with pytest.raises(ValueError, match="closed"):
        s.route(0, [1])


def test_reads_ahead_follow_the_previous_tokens_routing_of_the_next_layers() -> None:
    ahead = PreviousTokenPrefetch(2, [10, 0, 10, 10])  # layer 1 has no routed experts
    assert ahead.after_request(0, [1, 2], n_tokens=5) == []  # prefill: nothing
    assert ahead.after_request(0, [1, 2], n_tokens=1) == []  # nothing known of layers 2, 3 yet
    assert ahead.after_request(2, [3], n_tokens=1) == []
    assert ahead.after_request(3, [4, 4], n_tokens=1) == []
    # the next token: after layer 0, layers 2 and 3 as the previous token routed them
    assert ahead.after_request(0, [5], n_tokens=1) == [(2, [3]), (3, [4])]
    assert PreviousTokenPrefetch(1, [10, 0, 10, 10]).after_request(0, [1], 1) == []


def test_a_read_ahead_is_waited_for_not_read_again_and_hides_behind_compute() -> None:
    source = FakeExpertSource([64, 64, 64], 8, latency=0.010, lanes=2)
    s = PolicyStreaming(source, budget_bytes=64 * 2, prefetch_depth=1)
    for layer, ids in [(0, [1]), (1, [2]), (2, [3])]:  # token 1 (the cache keeps 2 entries)
        s.route(layer, ids)
    s.route(0, [4])  # token 2, layer 0: evicts (1, 2), then reads it ahead for layer 1
    assert source.in_flight() == [(1, 2)]
    source.advance(0.006)  # layer 0's experts and layer 1's attention compute meanwhile
    stall = s.stall_s
    plan = s.route(1, [2])
    assert plan.adopted == ((1, 2),) and plan.loads == ()
    assert s.stall_s - stall == pytest.approx(0.004)  # only the rest of the read is waited for
    assert source.reads.count((1, 2)) == 2  # token 1's read and the read ahead, never a third
    assert source.read_back((1, 2)) == source.file_bytes((1, 2))
    assert s.counters().prefetch_hits == 1
    s.policy.check_valid()


def test_a_prefill_batch_that_routes_most_experts_reads_the_next_layer_ahead() -> None:
    assert prefill_reads_ahead(n_tokens=512, n_routed=64, n_expert=128)
    assert not prefill_reads_ahead(n_tokens=512, n_routed=63, n_expert=128)
    assert not prefill_reads_ahead(n_tokens=1, n_routed=128, n_expert=128)  # decode
    assert next_moe_layer(0, [64, 0, 64]) == 2 and next_moe_layer(2, [64, 0, 64]) is None
    source = FakeExpertSource([64, 0, 64], 4, latency=0.010, lanes=2)
    s = PolicyStreaming(source, budget_bytes=64 * 8, prefill_ahead=True)
    s.route(0, [0, 1, 2, 0], n_tokens=2)  # 3 of 4 experts: read all of layer 2 ahead
    assert source.in_flight() == [(2, 0), (2, 1), (2, 2), (2, 3)]
    plan = s.route(2, [3, 1], n_tokens=2)
    assert plan.loads == () and plan.adopted == ((2, 3), (2, 1))
