"""The streamer's setup knobs as one value (``StreamerSettings``): checked when built, built
from a ``StreamConfig`` in one place."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from bmoe.domain.streaming import EngineOptions, StreamConfig
from bmoe.domain.streaming.decode_routing import RoutingSettings
from bmoe.domain.streaming.streamer_settings import StreamerSettings
from bmoe.errors import ConfigError

RESOLVED = EngineOptions(rank_worker=True)

# every field away from its default, in two values (pass_layers excludes the routing policies)
PASSING = StreamerSettings(
    eviction="slru",
    half_life=7,
    prefetch_k=2,
    prefill_ahead=False,
    pass_layers=True,
    engine=EngineOptions(
        projection_waits=False,
        orphan_reads=False,
        rank_worker=False,
        page_recycle=False,
        page_release="all",
        lane_delay_us=5,
    ),
)
ROUTING = StreamerSettings(
    eviction="lfu",
    half_life=9,
    routing=RoutingSettings(
        predict_log=True,
        predict_prefetch=True,
        predict_auto=True,
        spec_max=3,
        predict_depth=2,
        route_ahead=1,
        drop_cold=0.25,
        substitute=0.5,
    ),
    engine=EngineOptions(rank_worker=True, page_release="inline"),
)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"eviction": "fifo"}, "eviction must be one of slru, lfu"),
        ({"half_life": 0}, "half_life must be >= 1"),
        ({"prefetch_k": -1}, "prefetch_k must be >= 0"),
        ({"routing": RoutingSettings(spec_max=0)}, "routing.spec_max"),
        ({"routing": RoutingSettings(predict_depth=5)}, r"routing.predict_depth must be in 1\.\.4"),
        ({"routing": RoutingSettings(route_ahead=-1)}, "routing.route_ahead"),
        ({"routing": RoutingSettings(drop_cold=-0.5)}, "routing.drop_cold"),
        ({"routing": RoutingSettings(substitute=-0.1)}, "routing.substitute"),
        ({"routing": RoutingSettings(predict_log=True, predict_auto=True)}, "predict_auto needs"),
        ({"pass_layers": True, "routing": RoutingSettings(route_ahead=1)}, "pass_layers excludes"),
        ({"engine": EngineOptions()}, "engine.rank_worker must be decided"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_its_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StreamerSettings(**changes)


def test_built_from_a_stream_config_in_one_place() -> None:
    engine = EngineOptions(rank_worker=False, page_release="all")
    config = StreamConfig(
        enabled=True,
        eviction="slru",
        half_life=5,
        prefetch=1,
        prefill_ahead=False,
        pass_layers=True,
    )
    assert StreamerSettings.of(config, engine) == StreamerSettings(
        eviction="slru", half_life=5, prefetch_k=1, prefill_ahead=False, pass_layers=True, engine=engine
    )
    routed = StreamConfig(
        enabled=True,
        pass_layers=True,  # not in force beside a routing policy (StreamConfig.layers_passed)
        predict_prefetch=True,
        predict_auto=True,
        predict_spec_max=3,
        predict_depth=2,
        drop_cold=0.5,
        substitute=0.25,
    )
    settings = StreamerSettings.of(routed, RESOLVED)
    assert not settings.pass_layers
    assert settings.routing == RoutingSettings(
        predict_prefetch=True, predict_auto=True, spec_max=3, predict_depth=2, drop_cold=0.5, substitute=0.25
    )


def test_without_a_routing_policy_the_routing_knobs_stay_off() -> None:
    """``--predict-spec-max`` or ``--predict-depth`` alone change nothing: as before, the
    streamer's routing is left at its defaults unless a policy runs."""
    config = StreamConfig(enabled=True, predict_spec_max=4, predict_depth=3)
    assert StreamerSettings.of(config, RESOLVED).routing == RoutingSettings()


def test_for_reference_turns_off_what_the_reference_policy_decides() -> None:
    assert ROUTING.for_reference() == StreamerSettings(
        eviction="lfu", half_life=9, prefill_ahead=False, engine=ROUTING.engine
    )
    assert PASSING.for_reference() == attrs.evolve(PASSING, prefetch_k=0, pass_layers=False)
