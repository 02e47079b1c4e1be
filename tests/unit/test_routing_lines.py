"""The one-shot summary's lines for the decode routing policies (docs/read-ahead.md)."""

from __future__ import annotations

import attrs

from bmoe.domain.streaming import StreamCounters, StreamReport
from bmoe.domain.summary import routing_lines


def report(decode: StreamCounters) -> StreamReport:
    return StreamReport(prefill=StreamCounters(), decode=decode, decode_steps=10, decode_wall_s=1.0)


def test_no_policy_no_line() -> None:
    assert routing_lines(report(StreamCounters(decode_slots=80))) == []


def test_each_policy_reports_what_it_did() -> None:
    lines = routing_lines(
        report(
            StreamCounters(
                decode_slots=80,
                predict_layers=((0, 0), (40, 30), (40, 20)),
                route_ahead_committed=30,
                route_ahead_passed=10,
                route_ahead_slots=60,
                route_ahead_agree=45,
                dropped=8,
                substituted=4,
                rank_s=0.02,
                issue_s=0.005,
                watchdog_checks=3,
                watchdog_trips=1,
                stall_layers=(0.05, 0.012, 0.0),
                stall_s=0.062,
                stall_ahead_s=0.012,
            )
        )
    )
    cost = "ranking 2.00 ms/token, issuing reads 0.50 ms/token"
    assert lines == [
        "moe-predict: the next layer's router on this layer's input named 62.5% of 80 routed slots "
        f"(per MoE layer: 75.0% 50.0%); {cost}",
        "moe-route-ahead: 30 routings committed, 10 passed through; committed selection agreed with "
        f"the router on 75.0% of slots; {cost}",
        "moe-stall: waiting for reads by layer, ms/token: 5.0 1.2 0.0; of the total 6.2, 1.2 in layers "
        "that missed nothing (reads ahead not landed yet)",
        "moe-drop: 8 of 80 decode slots not read (10.0%), weights zeroed and the survivors renormalised",
        "moe-substitute: 4 of 80 decode slots served by a resident expert instead (5.0%)",
        "moe-watchdog: the router evaluated here disagreed with the graph's (3 checks): prediction and "
        "route-ahead are disarmed for this session",
    ]


def test_the_cost_says_where_the_rankings_were_made() -> None:
    def line(**made: object) -> str:
        counters = StreamCounters(route_ahead_committed=4, route_ahead_slots=8, route_ahead_agree=6)
        decode = attrs.evolve(counters, **made)  # type: ignore[arg-type]
        return routing_lines(report(decode))[0]

    assert line(rank_s=0.01, rank_wait_s=0.005, rank_worker=True).endswith(
        "ranking 1.00 ms/token on the worker (the eval thread waited 0.50), issuing reads 0.00 ms/token"
    )
    assert line(rank_s=0.01).endswith("ranking 1.00 ms/token, issuing reads 0.00 ms/token")


def test_the_auto_gate_says_how_often_it_was_open() -> None:
    (line,) = routing_lines(report(StreamCounters(predict_gate_open=30, predict_gate_closed=10)))
    assert line.startswith("moe-predict: auto: the gate was open on 30 of 40 decode layer calls (75")
