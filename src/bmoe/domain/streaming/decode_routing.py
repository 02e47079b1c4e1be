"""The decode routing policies, layer call by layer call (docs/read-ahead.md): the stale-gate
prediction (``--predict-log``, ``--predict-prefetch``), route-ahead, dropping cold experts and
substituting resident ones.

This is the reference the C engine follows decision for decision (``route_decode`` and
``rank_ahead`` in ``cext/stream/routing.pxi``); the reference mode (``--stream-policy
reference``) runs it, and the gates compare both. Per decode layer call (one token):

1. ``route(layer, ids, probs, scorer)``, before the layer's experts are requested: a new
   token starts at a layer not after the last one seen; the sampled watchdog (the first
   token and every 16th) ranks the layer's own router on its input and disarms prediction
   and route-ahead for good when it misses more than a quarter of the graph's selection
   (one slot below top-4); the prediction made for this layer earlier in the token is graded
   against the graph's selection; route-ahead replaces the selection with the ranking made
   ``N`` MoE layers earlier in the token (or the layer passes through); then substitution,
   then dropping, both against the cache's residency now. The returned ``DecodeRoute`` says
   the selection to write back, and which slots are dropped (not requested: their weights
   are zeroed by the mechanism);
2. ``reads_ahead(layer)``, after the layer's load: rank the next ``predict_depth`` MoE
   layers' routers, nearest first (prediction), and the one ``N`` MoE layers on
   (route-ahead) on this layer's router input, and plan their reads ahead through the cache
   policy: drop-aware, a guess reads at most ``spec_max`` misses per layer and enters cold, a
   committed routing reads them all and enters hot. A layer guessed at depth 2 is guessed
   again at depth 1 one layer later: the misses the first guess queued count as resident
   then, so the second reads only what the first missed (``spec_max`` more at most).

``--predict-prefetch auto`` reads the stale gate's guesses only where they pay: while decode
is latency-bound. The gate is the share of *cold* slots (misses) over the last
``AUTO_WINDOW`` decode layer calls (``observe``, after each call's plan). At most
``AUTO_COLD_PCT`` percent cold: the cache holds nearly everything, the few reads a token
needs take less time than its compute, and the guesses' wasted reads have idle lanes to
take; above it the lanes carry the token's own reads and a guess's wasted read delays them
(measured: docs/benchmarks.md, "An adaptive stale gate"). While the gate is closed the next
layer is not even ranked. A guess that a layer then adopts is a hit, so an open gate lowers
the share it is judged on: the gate has some hysteresis (the I/O-bound caches measured stay
far above the mark with the guesses on: 14% and 42% cold). Hits on entries read ahead
long before (a prefill's next layer, a usage profile's warm-up) are hits too, which is why
adopted entries are not counted cold. Counts of whole slots in a ring of calls: the C engine
computes the same integers.

A router is evaluated by the ``scorer`` the mechanism gives for the layer call (the C GEMV
the fast path uses: summing in another order would break ties differently); ``None`` when
the router's input cannot be read or the call's top-k is not the model's, and then nothing
is ranked, checked or read ahead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import attrs

from bmoe.domain.streaming.cache_policy import ExpertCachePolicy, PrefetchPlan
from bmoe.domain.streaming.routing import (
    drop_cold,
    rank,
    routing_weights,
    slot_agreement,
    substitute,
    weight_threshold_ids,
)

SOFTMAX, SIGMOID, SOFTMAX_WEIGHT, SQRT_SOFTPLUS = 1, 2, 3, 4  # llama.cpp's expert_gating_func
WATCHDOG_EVERY = 16  # decode tokens between two watchdog checks (the first token is checked)
AUTO_WINDOW = 64  # decode layer calls the auto gate looks back over (the C engine's too)
AUTO_COLD_PCT = 10  # the auto gate is open while at most this share of slots is cold
MAX_PREDICT_DEPTH = 4  # --predict-depth: MoE layers guessed ahead (the C engine's MAX_TARGETS)


def auto_gate_open(cold: int, slots: int) -> bool:
    """``--predict-prefetch auto``: read guesses ahead while at most ``AUTO_COLD_PCT`` percent
    of the window's slots were cold (nothing observed yet: closed)."""
    return slots > 0 and 100 * cold <= AUTO_COLD_PCT * slots


@attrs.frozen
class RoutingSettings:
    """The decode routing flags (``StreamConfig``'s)."""

    predict_log: bool = False
    predict_prefetch: bool = False
    predict_auto: bool = False  # with predict_prefetch: only while the auto gate is open
    spec_max: int = 2
    predict_depth: int = 1  # MoE layers the stale gate guesses ahead, nearest first
    route_ahead: int = 0
    drop_cold: float = 0.0
    substitute: float | None = None

    @property
    def predict(self) -> bool:
        return self.predict_log or self.predict_prefetch

    @property
    def active(self) -> bool:
        return self.predict or bool(self.route_ahead or self.drop_cold) or self.substitute is not None


@attrs.frozen
class Routers:
    """What is known of the model's routers: experts per token, llama.cpp's gating function
    (1 softmax, 2 sigmoid, 3 softmax over the selected logits, 4 sqrt(softplus)) and the
    layers whose router can be evaluated."""

    k: int
    gating: int
    layers: frozenset[int]


@attrs.frozen
class RouterScores:
    """One router evaluated on a layer call's input: ``selection``, the scores top-k ranks;
    ``values``, what the selected experts' weights are made of (the logits for the softmax
    gatings, else the gated probabilities)."""

    selection: tuple[float, ...]
    values: tuple[float, ...]


Scorer = Callable[[int], RouterScores]  # layer -> its router on the current call's input


@attrs.frozen
class DecodeRoute:
    """What ``route`` decided: the selection (``rewritten``: it differs from the graph's, or
    a committed ranking replaced it) and the dropped slots (not read)."""

    ids: tuple[int, ...]
    dropped: tuple[bool, ...]
    rewritten: bool = False

    @property
    def served(self) -> list[int]:
        """The ids to request: the selection less its dropped slots."""
        return [e for e, gone in zip(self.ids, self.dropped, strict=True) if not gone]


@attrs.define
class RoutingCounters:
    """Cumulative counts (``StreamCounters``' routing fields)."""

    decode_slots: int = 0
    predict_slots: dict[int, int] = attrs.Factory(dict)  # per layer
    predict_agree: dict[int, int] = attrs.Factory(dict)
    route_ahead_committed: int = 0
    route_ahead_passed: int = 0
    route_ahead_slots: int = 0
    route_ahead_agree: int = 0
    dropped: int = 0
    substituted: int = 0
    watchdog_checks: int = 0
    watchdog_trips: int = 0
    predict_gate_open: int = 0
    predict_gate_closed: int = 0


class DecodeRouting:
    """The policies of one session; ``cache`` is the session's cache policy (read for
    residency, asked for the reads ahead)."""

    def __init__(self, settings: RoutingSettings, routers: Routers, cache: ExpertCachePolicy) -> None:
        if settings.spec_max < 1 or settings.route_ahead < 0 or settings.drop_cold < 0.0:
            raise ValueError("invalid routing settings")
        if not 1 <= settings.predict_depth <= MAX_PREDICT_DEPTH:
            raise ValueError(f"the prediction depth must be in 1..{MAX_PREDICT_DEPTH}")
        if settings.substitute is not None and settings.substitute < 0.0:
            raise ValueError("the substitution margin must be >= 0")
        if not 0 < routers.k <= cache.n_expert or routers.gating not in (1, 2, 3, 4):
            raise ValueError("need 0 < k <= n_expert and a gating function in 1..4")
        self.settings = settings
        self.routers = routers
        self.cache = cache
        self.counters = RoutingCounters()
        self.disarmed = False
        self.trip: tuple[int, int, int] | None = None  # (token, layer, agreeing slots)
        self._token = 0
        self._last_layer: int | None = None
        self._scorer: Scorer | None = None  # the current call's, until its reads ahead
        self._ranked: dict[int, tuple[list[int], list[float], int]] = {}  # layer -> (ids, weights, token)
        self._window: deque[tuple[int, int]] = deque()  # the auto gate's last calls: (cold, slots)
        self._cold = 0
        self._slots = 0
        self.gate_open = not settings.predict_auto

    def observe(self, cold: int, slots: int) -> None:
        """A decode layer call's plan: ``slots`` entries wanted, ``cold`` of them missed.
        Moves the auto gate."""
        self._window.append((cold, slots))
        self._cold += cold
        self._slots += slots
        if len(self._window) > AUTO_WINDOW:
            old_cold, old_slots = self._window.popleft()
            self._cold -= old_cold
            self._slots -= old_slots
        if self.settings.predict_auto and self.settings.predict_prefetch:
            self.gate_open = auto_gate_open(self._cold, self._slots)
            if self.gate_open:
                self.counters.predict_gate_open += 1
            else:
                self.counters.predict_gate_closed += 1

    def route(
        self, layer: int, ids: Sequence[int], probs: Sequence[float] | None, scorer: Scorer | None
    ) -> DecodeRoute:
        """Decide a decode token's layer call (see the module docstring). ``probs``: the
        router's probabilities of every expert (None when they cannot be read: no
        substitution nor dropping)."""
        if self._last_layer is None or layer <= self._last_layer:
            self._token += 1
        self._last_layer = layer
        self._scorer = None
        selected = [int(e) for e in ids]
        k, n = len(selected), self.cache.n_expert
        unchanged = DecodeRoute(tuple(selected), (False,) * k)
        if not 0 < k <= n or any(not 0 <= e < n for e in selected):
            return unchanged  # the request reports the graph fault
        s, c = self.settings, self.counters
        self._scorer = scorer if k == self.routers.k else None
        c.decode_slots += k
        if (
            (s.predict or s.route_ahead)
            and not self.disarmed
            and self._scorer is not None
            and layer in self.routers.layers
            and self._token % WATCHDOG_EVERY == 1
        ):
            self._watchdog(layer, selected, self._scorer)
        ranking = self._ranking(layer)
        if s.predict and ranking is not None:
            c.predict_slots[layer] = c.predict_slots.get(layer, 0) + k
            c.predict_agree[layer] = c.predict_agree.get(layer, 0) + slot_agreement(ranking[:k], selected)
        out, rewritten = list(selected), False
        if s.route_ahead:
            if not self.disarmed and ranking is not None and k == self.routers.k:
                c.route_ahead_agree += slot_agreement(ranking, out)
                c.route_ahead_slots += k
                c.route_ahead_committed += 1
                out, rewritten = list(ranking), True
            else:
                c.route_ahead_passed += 1
        dropped = [False] * k
        if s.substitute is not None and probs is not None:
            resident = [self.cache.is_resident((layer, e)) for e in range(n)]
            swapped = substitute(out, probs, resident, s.substitute)
            changed = sum(1 for a, b in zip(swapped, out, strict=True) if a != b)
            if changed:
                out, rewritten = swapped, True
                c.substituted += changed
        if s.drop_cold > 0.0 and probs is not None:
            weights = routing_weights(
                [probs[e] for e in out], from_logits=self.routers.gating == SOFTMAX_WEIGHT
            )
            resident = [self.cache.is_resident((layer, e)) for e in out]
            dropped = drop_cold(weights, resident, s.drop_cold)
            c.dropped += sum(dropped)
        return DecodeRoute(tuple(out), tuple(dropped), rewritten)

    def reads_ahead(self, layer: int) -> list[PrefetchPlan]:
        """After the layer call ``route`` decided was loaded: rank the layers ahead on its
        router input and plan their reads ahead (in order of execution; the cache policy
        has already taken each plan into account)."""
        scorer, self._scorer = self._scorer, None
        s = self.settings
        plans: list[PrefetchPlan] = []
        if scorer is None or self.disarmed:
            return plans
        guesses = [(depth, False, s.predict and self.gate_open) for depth in range(1, s.predict_depth + 1)]
        for depth, committed, wanted in (*guesses, (s.route_ahead, True, s.route_ahead > 0)):
            if not wanted:
                continue
            target = self._moe_layer_ahead(layer, depth)
            if target is None:
                continue
            self._rank(target, scorer)
            if self.cache.budget_bytes > 0 and (committed or s.predict_prefetch):
                plans.append(self._issue(target, committed))
        return plans

    def predict_layers(self, n_layer: int) -> tuple[tuple[int, int], ...]:
        """Per layer: (slots predicted, slots the prediction named)."""
        c = self.counters
        return tuple((c.predict_slots.get(i, 0), c.predict_agree.get(i, 0)) for i in range(n_layer))

    def _ranking(self, layer: int) -> list[int] | None:
        """The ranking made for ``layer`` earlier in this token, if any."""
        made = self._ranked.get(layer)
        return made[0] if made is not None and made[2] == self._token else None

    def _moe_layer_ahead(self, layer: int, n: int) -> int | None:
        """The ``n``-th layer after ``layer`` with routed experts and a known router."""
        seen = 0
        for ahead in range(layer + 1, len(self.cache.entry_bytes)):
            if self.cache.entry_bytes[ahead] > 0 and ahead in self.routers.layers:
                seen += 1
                if seen == n:
                    return ahead
        return None

    def _rank(self, target: int, scorer: Scorer) -> None:
        scores = scorer(target)
        ids = rank(scores.selection, self.routers.k)
        from_logits = self.routers.gating in (SOFTMAX, SOFTMAX_WEIGHT)
        weights = routing_weights([scores.values[e] for e in ids], from_logits=from_logits)
        self._ranked[target] = (ids, weights, self._token)

    def _issue(self, target: int, committed: bool) -> PrefetchPlan:
        ids, weights, _ = self._ranked[target]
        wanted: list[int] = []
        misses = 0
        for e in weight_threshold_ids(ids, weights, self.settings.drop_cold):
            if committed or self.cache.is_resident((target, e)):
                wanted.append(e)
            elif misses < self.settings.spec_max:
                wanted.append(e)
                misses += 1
        return self.cache.prefetch(target, wanted, hot=committed)

    def _watchdog(self, layer: int, selected: list[int], scorer: Scorer) -> None:
        k = len(selected)
        tolerated = k // 4 if k >= 4 else 1
        agree = slot_agreement(rank(scorer(layer).selection, k), selected)
        self.counters.watchdog_checks += 1
        if agree < k - tolerated:
            self.disarmed = True
            self.counters.watchdog_trips += 1
            self.trip = (self._token, layer, agree)
