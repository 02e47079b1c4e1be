"""Expert streaming settings (the budget rule is :mod:`bmoe.domain.streaming.budget`)."""

from __future__ import annotations

import attrs

from bmoe.domain.streaming.cache_policy import DEFAULT_EVICTION, DEFAULT_HALF_LIFE, EVICTIONS, Eviction
from bmoe.domain.streaming.decode_routing import MAX_PREDICT_DEPTH
from bmoe.domain.streaming.engine_options import EngineOptions
from bmoe.domain.streaming.usage_profile import WARM_SHARE
from bmoe.domain.streaming.victims import DEFAULT_VICTIMS, VICTIMS_SETTINGS, VictimsSetting
from bmoe.errors import ConfigError

MIB = 1024 * 1024
STREAM_POLICIES = ("fast", "reference")
GOVERNOR_MODES = ("auto", "on", "off")


@attrs.frozen
class StreamConfig:
    """``--moe-stream`` and its knobs.

    - ``cache_mb``: the expert cache's budget in MiB; None = auto (available memory minus a
      floor, capped by ``cache_ceil_mb``, at least one token cycle); 0 = cache off.
    - ``governor``: the memory-pressure governor moves the budget as memory comes and goes,
      between the token cycle and ``cache_ceil_mb`` (else the budget at start): ``auto`` (the
      default) under ``cache_mb`` auto, ``on`` with a budget in MiB too, ``off`` never
      (:mod:`bmoe.domain.streaming.governor`).
    - ``io_threads``: read lanes. ``odirect``: read with ``O_DIRECT`` (falls back to buffered
      reads, and says so, where the filesystem refuses it).
    - ``policy``: ``"fast"`` (the C engine decides and reads inside llama.cpp's eval callback)
      or ``"reference"`` (each MoE layer's routing goes to the Python policies,
      ``ExpertCachePolicy`` and the decode routing ones, ``DecodeRouting``, and their plans
      are executed through the expert-source port: slow, for checking that the C engine
      follows the policies; the output is identical; no traces).
    - ``profile``: the usage profile (:mod:`bmoe.domain.streaming.usage_profile`): ``off``
      (the library's default), ``auto`` (one file per model under the user's cache folder;
      the command line's and the server's default) or a file. With one, a new session warms
      its cache with the experts earlier sessions routed most (up to ``profile_share`` of
      the budget, read in the background) and merges what it routes into the file.
    - ``eviction``: what the expert cache evicts first (``--cache-policy``): ``"slru"`` (the
      segmented LRU's least recent), ``"lfu"`` (the fewest recent uses, counts halved every
      ``half_life`` decode tokens, ``--cache-half-life``; the list's order among equals),
      ``"lru"`` (no protected segment) or ``"adaptive"`` (the default: whichever of the three
      its ghost caches found hitting most on the last decode tokens,
      :mod:`bmoe.domain.streaming.rule_chooser`), :mod:`bmoe.domain.streaming.cache_policy`.
      Lossless either way: only what is read changes.
    - ``victims``: whose entries a miss evicts (``--cache-victims``): ``"global"`` (the
      rule's choice over every layer) or ``"layer"`` (the missing layer's own
      first, where its share of the budget holds two tokens' top-k; each miss is then read
      into its victim's row, no page moved: faster where a page move is dear and the disk
      fast, a few points fewer hits; where the model's graph gathers per-expert tensors by
      id, gpt-oss and gemma4, ``"global"``), or ``"auto"`` (the default: whichever of the two
      costs this machine less, weighed every 16 decode tokens from the reads and page moves measured and
      a twin of the cache under the other scope: ``victims_chooser``),
      ``bmoe.domain.streaming.victims``.
    - ``pass_layers``: a call of a layer the cache holds whole (every expert resident) is
      passed: no request, and llama.cpp's graph does not stop at the layer's routing for the
      callback (``ExpertCachePolicy.pass_layer``; never under the decode routing policies and
      the traces, which want every call). Off by default: on this project's CPU it bought
      nothing measurable (docs/benchmarks.md), and a passed call's routing is not seen (the
      hit rate, the usage profile and the live grid count only the calls served).
    - ``size_prompt_batch``: the context's prompt batch (``n_batch = n_ubatch``) is chosen
      when the session opens, the largest the memory room allows up to the context, and the
      expert cache lends it its room while a prompt runs
      (:mod:`bmoe.domain.streaming.prefill_memory`); the command line's default where ``-b``
      is unsaid. Off: the context's batch sizes as given.
    - ``engine``: developer-only, for A/B measurements and tests: how the C engine does its
      work (``EngineOptions``; the output and decisions stay the same); None reads the
      ``BMOE_*`` variables (``EngineOptions.from_environ``).
    - ``prefetch``: in decode, after each MoE layer, read ahead the next ``prefetch`` MoE
      layers' experts as the previous token routed them, on the lanes while llama.cpp
      computes; they enter the cache at its cold end (lossless; needs the cache).
    - ``prefill_ahead``: in a prefill batch that routes to at least half of a layer's
      experts, read the whole next layer ahead while this one computes (lossless; needs the
      cache to hold it).
    - ``predict_prefetch``: in decode, apply the next MoE layer's router to this layer's
      router input (the stale gate) and read its predicted misses ahead, at most
      ``predict_spec_max`` per layer (lossless; needs the cache); ``predict_depth`` N > 1
      guesses each of the next N MoE layers so (reads issued earlier, guessed less well).
    - ``predict_auto``: with ``predict_prefetch``, read the guesses only while decode is
      latency-bound: at most 10% of the experts the last 64 decode layer calls wanted missed
      the cache (``decode_routing.auto_gate_open``); the next layer is not even ranked otherwise.
    - ``predict_log``: the same prediction, observed only (no reads): its accuracy per layer.
    - ``route_ahead``: N > 0 replaces each decode layer's selection with the ranking its
      router gave the input N MoE layers earlier, and reads those experts that early (lossy).
    - ``drop_cold``: F > 0: in decode, a selected expert that is not resident and whose
      weight is below F / top-k is not read, its weight zeroed (lossy; needs the cache).
    - ``substitute``: L: in decode, a selected expert that is not resident is replaced by a
      resident one whose router score is within L of it (lossy; needs the cache).
    """

    enabled: bool = False
    cache_mb: int | None = None
    cache_ceil_mb: int | None = None
    governor: str = "auto"
    io_threads: int = 4
    odirect: bool = True
    policy: str = "fast"
    eviction: Eviction = DEFAULT_EVICTION  # --cache-policy
    victims: VictimsSetting = DEFAULT_VICTIMS  # --cache-victims
    half_life: int = DEFAULT_HALF_LIFE  # --cache-half-life, decode tokens
    pass_layers: bool = False
    prefetch: int = 0
    prefill_ahead: bool = True
    predict_prefetch: bool = False
    predict_auto: bool = False  # --predict-prefetch auto
    predict_spec_max: int = 2
    predict_depth: int = 1  # --predict-depth: MoE layers guessed ahead, nearest first
    predict_log: bool = False
    route_ahead: int = 0
    drop_cold: float = 0.0
    substitute: float | None = None
    profile: str = "off"  # --profile off|auto|FILE
    profile_share: float = WARM_SHARE  # --profile-share
    route_trace: str | None = None  # --route-trace FILE (docs/telemetry.md)
    io_trace: str | None = None  # --io-trace FILE
    expert_store: str = "auto"  # --expert-store auto|off|PATH (bmoe.domain.expert_store)
    size_prompt_batch: bool = False
    engine: EngineOptions | None = None

    @property
    def governed(self) -> bool:
        """The governor runs: ``on`` with a cache, ``auto`` under an auto budget."""
        if self.governor == "on":
            return self.cache_mb != 0
        return self.governor == "auto" and self.cache_mb is None

    @property
    def routing_policies(self) -> bool:
        """A decode routing policy that evaluates the routers or rewrites the selection."""
        return bool(self.predict_prefetch or self.predict_log or self.route_ahead or self.drop_cold) or (
            self.substitute is not None
        )

    @property
    def layers_passed(self) -> bool:
        """``pass_layers`` in force: never beside the decode routing policies or the traces,
        which want every layer call's routing."""
        traced = self.route_trace is not None or self.io_trace is not None
        return self.pass_layers and not self.routing_policies and not traced

    @property
    def needs_routers(self) -> bool:
        """The streamer must know the routers (policies, or the route trace's weights)."""
        return self.routing_policies or self.route_trace is not None

    def __attrs_post_init__(self) -> None:
        if self.cache_mb is not None and self.cache_mb < 0:
            raise ConfigError(f"cache_mb must be >= 0 (0 = cache off), not {self.cache_mb}")
        if self.cache_ceil_mb is not None and self.cache_ceil_mb < 0:
            raise ConfigError(f"cache_ceil_mb must be >= 0, not {self.cache_ceil_mb}")
        if self.governor not in GOVERNOR_MODES:
            raise ConfigError(f"governor must be one of {', '.join(GOVERNOR_MODES)}, not {self.governor!r}")
        if self.governor == "on" and self.cache_mb == 0:
            raise ConfigError("--cache-governor on needs the cache: not with --cache-mb 0")
        if self.policy not in STREAM_POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(STREAM_POLICIES)}, not {self.policy!r}")
        if self.victims not in VICTIMS_SETTINGS:
            raise ConfigError(
                f"--cache-victims must be one of {', '.join(VICTIMS_SETTINGS)}, not {self.victims!r}"
            )
        if self.eviction not in EVICTIONS:
            raise ConfigError(f"--cache-policy must be one of {', '.join(EVICTIONS)}, not {self.eviction!r}")
        if self.half_life < 1:
            raise ConfigError(f"--cache-half-life must be >= 1 decode token, not {self.half_life}")
        if self.prefetch < 0:
            raise ConfigError(f"prefetch must be >= 0 layers, not {self.prefetch}")
        if self.prefetch and self.cache_mb == 0:
            raise ConfigError("--prefetch needs the cache (reads ahead land in it): not with --cache-mb 0")
        if not self.profile:
            raise ConfigError("--profile takes off, auto or a file name")
        if not 0.0 <= self.profile_share <= 1.0:
            raise ConfigError(f"--profile-share must be in [0, 1], not {self.profile_share}")
        if self.io_threads < 1:
            raise ConfigError(f"io_threads must be >= 1, not {self.io_threads}")
        check_read_ahead(self)


def _routing_flags(config: StreamConfig) -> list[str]:
    """The decode-time routing flags that are set, as the user wrote them."""
    flags = []
    if config.prefetch:
        flags.append("--prefetch")
    if config.predict_prefetch:
        flags.append("--predict-prefetch")
    if config.predict_log:
        flags.append("--predict-log")
    if config.route_ahead:
        flags.append("--route-ahead")
    if config.drop_cold:
        flags.append("--drop-cold-experts")
    if config.substitute is not None:
        flags.append("--expert-substitute")
    return flags


def check_read_ahead(config: StreamConfig) -> None:
    """The combination rules of reading ahead, dropping and substituting (ConfigError)."""
    if config.predict_spec_max < 1:
        raise ConfigError(f"--predict-spec-max must be >= 1, not {config.predict_spec_max}")
    if not 1 <= config.predict_depth <= MAX_PREDICT_DEPTH:
        raise ConfigError(f"--predict-depth must be in 1..{MAX_PREDICT_DEPTH}, not {config.predict_depth}")
    if config.route_ahead < 0:
        raise ConfigError(f"--route-ahead must be >= 0 layers, not {config.route_ahead}")
    if not 0.0 <= config.drop_cold <= 1.0:
        raise ConfigError(f"--drop-cold-experts must be in [0, 1], not {config.drop_cold}")
    if config.substitute is not None and not config.substitute >= 0.0:
        raise ConfigError(f"--expert-substitute must be >= 0, not {config.substitute}")
    flags = _routing_flags(config)
    traces = [f for f, v in (("--route-trace", config.route_trace), ("--io-trace", config.io_trace)) if v]
    if traces and not config.enabled:
        raise ConfigError(f"{', '.join(traces)} need(s) --moe-stream")
    if flags and not config.enabled:
        raise ConfigError(f"{', '.join(flags)} need(s) --moe-stream")
    cached_only = ("--predict-prefetch", "--drop-cold-experts", "--expert-substitute")
    needs_cache = [f for f in flags if f in cached_only]
    if needs_cache and config.cache_mb == 0:
        raise ConfigError(f"{', '.join(needs_cache)} need(s) the cache: not with --cache-mb 0")
    if config.predict_auto and not config.predict_prefetch:
        raise ConfigError("predict_auto needs predict_prefetch (--predict-prefetch auto)")
    if config.predict_prefetch and config.prefetch:
        raise ConfigError("--predict-prefetch and --prefetch exclude each other (one prefetcher at a time)")
    if config.route_ahead:
        clash = [f for f in flags if f in ("--prefetch", "--predict-prefetch", "--predict-log")]
        if clash:
            raise ConfigError(
                f"--route-ahead excludes {', '.join(clash)}: the routing is already fixed ahead "
                "(a prefetcher would read it twice; the prediction log would grade the predictor "
                "against itself)"
            )
    if config.policy == "reference" and traces:
        raise ConfigError(f"--stream-policy reference does not write traces ({', '.join(traces)})")


RESIDENT_PROMPT_BATCH = 64
STREAMED_PROMPT_BATCH = 512


def prompt_batch(requested: int | None, *, streaming: bool, n_ctx: int) -> int:
    """Tokens per prompt batch (and ubatch) when the user did not say (``-b``).

    Streaming reads every expert a ubatch routes to once per ubatch, and a prompt's tokens
    route to nearly every expert of every layer: with 64-token ubatches a 512-token prompt
    read the bench model's experts 5.6 times over (20.5 GB, 20.4 s), with one 512-token
    ubatch once (3.7 GB, 8.4-9.4 s; docs/benchmarks.md). So streaming prefills in batches of
    512 (at most the context), resident runs in batches of 64. With ``-b`` unsaid, a
    streamed session then sizes its batch from the memory room when it opens
    (``StreamConfig.size_prompt_batch``): this figure is what its probe starts from.
    """
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"the prompt batch must be at least 1 token, not {requested}")
        return requested
    return min(STREAMED_PROMPT_BATCH, n_ctx) if streaming else RESIDENT_PROMPT_BATCH
