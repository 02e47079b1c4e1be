"""The streamer's setup knobs as one value (``StreamerSettings``): checked when built, built
from a ``StreamConfig`` in one place, and every field held by the C streamer after
``ExpertStreamer.configure``, read back from it."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import attrs
import pytest

from bmoe.cext.expert_stream import ExpertStreamer
from bmoe.domain.streaming import EngineOptions, StreamConfig
from bmoe.domain.streaming.decode_routing import RoutingSettings
from bmoe.domain.streaming.streamer_settings import StreamerSettings
from bmoe.errors import ConfigError

RESOLVED = EngineOptions(rank_worker=True)

# every field away from its default, in two values (pass_layers excludes the routing policies)
PASSING = StreamerSettings(
    eviction="slru",
    half_life=7,
    victims="layer",
    prefetch_k=2,
    prefill_ahead=False,
    pass_layers=True,
    engine=EngineOptions(
        projection_waits=False,
        orphan_reads=False,
        rank_worker=False,
        page_recycle=False,
        page_release="all",
        expert_rows="shuffled",
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


# -- the streamer takes it -------------------------------------------------------------


@pytest.fixture
def streamer() -> Iterator[ExpertStreamer]:
    """A streamer of 2 layers of 4 experts whose routers are known (width 8, top-2, softmax)."""
    s = ExpertStreamer(n_layer=2, n_expert=4, n_proj=1)
    s.set_router(8, 2, 1)
    yield s
    s.close()


def held(settings: StreamerSettings) -> dict[str, Any]:
    """What the streamer should hold after ``configure(settings)``, as ``settings()`` says it."""
    r = settings.routing
    engine = attrs.asdict(settings.engine)
    del engine["repack_parts"]  # the adapter's (it repacks by it), not the streamer's
    return {
        "eviction": settings.eviction,
        "half_life": settings.half_life,
        "victims": settings.victims,
        "prefetch_k": settings.prefetch_k,
        "prefill_ahead": settings.prefill_ahead,
        "pass_layers": settings.pass_layers,
        "routing": {
            "predict": (1 if r.predict else 0) | (2 if r.predict_prefetch else 0),
            "predict_auto": r.predict_auto,
            "spec_max": r.spec_max,
            "predict_depth": r.predict_depth,
            "route_ahead": r.route_ahead,
            "drop_cold": r.drop_cold,
            "substitute": r.substitute,
        },
        "engine": engine,
    }


@pytest.mark.parametrize(
    "settings", [PASSING, ROUTING, StreamerSettings()], ids=["passing", "routing", "defaults"]
)
def test_every_field_reaches_the_streamer(streamer: ExpertStreamer, settings: StreamerSettings) -> None:
    streamer.configure(settings)
    assert streamer.settings() == held(settings)
    assert streamer.eviction == settings.eviction


def test_a_routing_policy_starts_the_rank_worker_where_it_may_run(streamer: ExpertStreamer) -> None:
    streamer.configure(ROUTING)
    assert streamer.routing_stats()["rank_worker"]
    streamer.configure(attrs.evolve(ROUTING, engine=EngineOptions(rank_worker=False)))
    assert not streamer.routing_stats()["rank_worker"]  # stopped again


def test_under_the_reference_policy_the_streamer_takes_only_the_cache_rule_and_the_engine() -> None:
    """The reference policy decides the rest in Python: the C side keeps a new streamer's
    read-ahead, routing and passing knobs (no rank worker either)."""
    fresh = ExpertStreamer(n_layer=2, n_expert=4, n_proj=1)
    new = fresh.settings()
    fresh.close()
    for settings in (PASSING, ROUTING):
        s = ExpertStreamer(n_layer=2, n_expert=4, n_proj=1)  # no router: none is needed
        try:
            s.configure(settings.for_reference())
            taken = {
                k: v for k, v in held(settings).items() if k in ("eviction", "half_life", "victims", "engine")
            }
            assert s.settings() == {**new, **taken}
            assert not s.routing_stats()["rank_worker"]
        finally:
            s.close()


def test_the_routing_policies_need_the_routers_and_nothing_is_set_before_the_check() -> None:
    s = ExpertStreamer(n_layer=2, n_expert=4, n_proj=1)
    try:
        before = s.settings()
        with pytest.raises(ValueError, match="set_router first"):
            s.configure(ROUTING)
        assert s.settings() == before
    finally:
        s.close()


def test_the_streamer_refuses_engine_options_left_to_the_machine(streamer: ExpertStreamer) -> None:
    """``rank_worker`` None is decided by the adapter (``rank_on_worker``) before the streamer
    takes it; read as a plain attribute, it would silently turn the worker off."""
    fields = {f.name: getattr(PASSING, f.name) for f in attrs.fields(StreamerSettings)}
    unresolved = SimpleNamespace(**{**fields, "engine": EngineOptions()})
    with pytest.raises(ValueError, match="rank_worker"):
        streamer.configure(unresolved)  # type: ignore[arg-type]
