"""What the C streamer is set up with, as one value: ``StreamerSettings``.

The expert streamer (``bmoe.cext.expert_stream.ExpertStreamer``) takes its knobs once, at
setup, in one call (``ExpertStreamer.configure``), instead of one setter each. The value is
built from the session's ``StreamConfig`` in one place (:meth:`StreamerSettings.of`), and the
reference policy (``service.expert_streaming.PolicyStreaming``, ``--stream-policy
reference``) is fed from the same value, so the two ways of serving a layer cannot be set up
apart (``runtime.streaming.StreamingControl``).

Setup-only (this value; ``configure`` applies them between the streamer's setup and its first
decode, after the routers where the routing policies evaluate them):

- ``eviction``: what the cache evicts first, ``slru``, ``lfu``, ``lru`` or ``adaptive``
  (``--cache-policy``); with ``lfu`` and ``adaptive`` the counts halve every ``half_life``
  decode tokens (``--cache-half-life``);
- ``prefetch_k``: in decode, read the next K MoE layers' experts ahead as the previous token
  routed them, 0 off (``--prefetch``);
- ``prefill_ahead``: in a prefill batch that routes to half a layer's experts, read the whole
  next layer ahead (off with ``--no-prefill-ahead``);
- ``pass_layers``: a call of a layer the cache holds whole is passed (never beside the
  routing policies, which need every call);
- ``routing``: the decode routing policies (``RoutingSettings``: prediction, route-ahead,
  dropping, substitution), all off for none;
- ``engine``: how the engine works, never what it decides (``EngineOptions``, the ``BMOE_*``
  variables), resolved for this machine: ``rank_worker`` decided.

Changed while running (not here: the streamer's own setters, each between decodes): the
budget (``set_budget``: the governor, the prompt batch's lending, ``Session.set_cache_budget``),
``decode_rows`` (per parallel decode step) and ``mode`` (capture at setup, the fast path or
the reference hook, off at close).
"""

from __future__ import annotations

import attrs

from bmoe.domain.streaming.cache_policy import DEFAULT_EVICTION, DEFAULT_HALF_LIFE, EVICTIONS, Eviction
from bmoe.domain.streaming.config import StreamConfig
from bmoe.domain.streaming.decode_routing import MAX_PREDICT_DEPTH, RoutingSettings
from bmoe.domain.streaming.engine_options import EngineOptions
from bmoe.domain.streaming.victims import DEFAULT_VICTIMS, VICTIMS_SETTINGS, VictimsSetting
from bmoe.errors import ConfigError


@attrs.frozen
class StreamerSettings:
    """The streamer's setup knobs (module docstring). ``engine.repack_parts`` is not the
    streamer's (the adapter repacks by it) and ``configure`` leaves it be."""

    eviction: Eviction = DEFAULT_EVICTION
    half_life: int = DEFAULT_HALF_LIFE  # decode tokens
    victims: VictimsSetting = DEFAULT_VICTIMS
    prefetch_k: int = 0
    prefill_ahead: bool = True
    pass_layers: bool = False
    routing: RoutingSettings = attrs.field(factory=RoutingSettings)
    engine: EngineOptions = attrs.field(factory=lambda: EngineOptions(rank_worker=True))

    def __attrs_post_init__(self) -> None:
        if self.eviction not in EVICTIONS:
            raise ConfigError(f"eviction must be one of {', '.join(EVICTIONS)}, not {self.eviction!r}")
        if self.half_life < 1:
            raise ConfigError(f"half_life must be >= 1 decode token, not {self.half_life}")
        if self.victims not in VICTIMS_SETTINGS:
            raise ConfigError(f"victims must be one of {', '.join(VICTIMS_SETTINGS)}, not {self.victims!r}")
        if self.prefetch_k < 0:
            raise ConfigError(f"prefetch_k must be >= 0 layers, not {self.prefetch_k}")
        r = self.routing
        if r.spec_max < 1:
            raise ConfigError(f"routing.spec_max must be >= 1, not {r.spec_max}")
        if not 1 <= r.predict_depth <= MAX_PREDICT_DEPTH:
            raise ConfigError(
                f"routing.predict_depth must be in 1..{MAX_PREDICT_DEPTH}, not {r.predict_depth}"
            )
        if r.route_ahead < 0:
            raise ConfigError(f"routing.route_ahead must be >= 0 layers, not {r.route_ahead}")
        if r.drop_cold < 0.0:
            raise ConfigError(f"routing.drop_cold must be >= 0, not {r.drop_cold}")
        if r.substitute is not None and not r.substitute >= 0.0:
            raise ConfigError(f"routing.substitute must be >= 0 (None: off), not {r.substitute}")
        if r.predict_auto and not r.predict_prefetch:
            raise ConfigError("routing.predict_auto needs routing.predict_prefetch")
        if self.pass_layers and r.active:
            raise ConfigError("pass_layers excludes the decode routing policies (they need every layer call)")
        if self.engine.rank_worker is None:
            raise ConfigError(
                "engine.rank_worker must be decided (rank_on_worker) before the streamer takes it"
            )

    @classmethod
    def of(cls, config: StreamConfig, engine: EngineOptions) -> StreamerSettings:
        """The settings of ``config``; ``engine``: its engine options resolved for this machine
        (``ExpertStreaming.attach``: ``rank_worker`` decided, recycling off where the memory
        mappings could run out). ``pass_layers`` as in force (``StreamConfig.layers_passed``);
        the routing policies all off unless one runs (``StreamConfig.routing_policies``)."""
        routing = RoutingSettings()
        if config.routing_policies:
            routing = RoutingSettings(
                predict_log=config.predict_log,
                predict_prefetch=config.predict_prefetch,
                predict_auto=config.predict_auto,
                spec_max=config.predict_spec_max,
                predict_depth=config.predict_depth,
                route_ahead=config.route_ahead,
                drop_cold=config.drop_cold,
                substitute=config.substitute,
            )
        return cls(
            eviction=config.eviction,
            half_life=config.half_life,
            victims=config.victims,
            prefetch_k=config.prefetch,
            prefill_ahead=config.prefill_ahead,
            pass_layers=config.layers_passed,
            routing=routing,
            engine=engine,
        )

    def for_reference(self) -> StreamerSettings:
        """What the streamer takes under the reference policy, which makes these decisions in
        Python (``PolicyStreaming``, fed from ``self``): the C side only serves its hook, so
        no read ahead, no routing policy and no layer passed there; the eviction rule and the
        engine options as they are."""
        return attrs.evolve(
            self, prefetch_k=0, prefill_ahead=False, pass_layers=False, routing=RoutingSettings()
        )
