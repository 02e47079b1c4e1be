"""The activity between two counter snapshots: every count subtracted, sizes kept from the
later snapshot, per-layer prediction counts subtracted layer by layer."""

from __future__ import annotations

import attrs

from bmoe.domain.streaming import StreamCounters


def test_a_difference_subtracts_every_count_and_keeps_the_sizes() -> None:
    names = [f.name for f in attrs.fields(StreamCounters)]
    later = StreamCounters(**{n: 10 for n in names if n != "predict_layers"}, predict_layers=((5, 3), (2, 1)))
    earlier = StreamCounters(
        **{n: 4 for n in names if n != "predict_layers"}, predict_layers=((1, 1), (1, 0))
    )
    delta = later - earlier
    for name in names:
        expected = {"resident_bytes": 10, "budget_bytes": 10, "predict_layers": ((4, 2), (1, 1))}.get(name, 6)
        assert getattr(delta, name) == expected, name
    assert (later - StreamCounters()).predict_layers == ((5, 3), (2, 1))  # no layers before: as is
