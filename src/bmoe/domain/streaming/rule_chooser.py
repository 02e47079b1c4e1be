"""The rule chooser: which eviction rule the live expert cache runs under
``--cache-policy adaptive``, decided by the ghosts' hits (``ghost_caches``) on the routing
this run meets.

Decode requests only count: a prompt is a scan (every rule's ghost sees it, with the same
scan resistance, but its hits say little about the rule decode needs). The chooser sums each
ghost's hits over a *window* of ``window_tokens`` decode tokens (that many decode requests
per MoE layer); at the window's end, the rule with the most hits in it takes charge when it
leads the rule in charge by more than ``margin_permille`` thousandths of the window's
requested entries (ties keep the rule in charge; among the others the first of ``RULES``).
A window is a full, fresh one each time (the counts start again at 0): a rule leads over a
whole window, by a margin, before the live cache follows it, so a rule whose lead comes and
goes from one window to the next cannot make the cache flap.

Why 16 tokens and 10 thousandths (1 point): replayed (``python -m bmoe.bench.replay``,
docs/benchmarks.md), windows of 4 to 32 tokens and margins of 0.5 to 2 points all stayed
within 0.5 point of the best fixed rule on every regime; at 16 tokens and 1 point the
chooser never switched on the random bench model's routing or on Zipf's (LFU leads), switched
once where recency wins, and lost at most 0.3 point (shorter windows and smaller margins
switched up to 45 times on the same traces). A window of a 16-layer top-8 model
holds 2,048 requested experts, enough to put a point's lead above the noise.

Integer arithmetic only (the C core's ``core_choose`` makes the same decisions).
"""

from __future__ import annotations

from collections.abc import Mapping

from bmoe.domain.streaming.ghost_caches import RULES, Rule

WINDOW_TOKENS = 16
MARGIN_PERMILLE = 10
FIRST_RULE: Rule = "lfu"
"""The rule in charge before the first window ends: LFU, the fixed default's."""


class RuleChooser:
    """``n_moe``: the model's MoE layers (decode requests a token)."""

    def __init__(
        self,
        n_moe: int,
        *,
        first: Rule = FIRST_RULE,
        window_tokens: int | None = None,
        margin_permille: int | None = None,
    ) -> None:
        """``window_tokens``, ``margin_permille``: None for this module's ``WINDOW_TOKENS`` and
        ``MARGIN_PERMILLE`` (read when the chooser is made)."""
        window_tokens = WINDOW_TOKENS if window_tokens is None else window_tokens
        margin_permille = MARGIN_PERMILLE if margin_permille is None else margin_permille
        if window_tokens < 1 or margin_permille < 0:
            raise ValueError("the window must be >= 1 token and the margin >= 0")
        if first not in RULES:
            raise ValueError(f"the first rule must be one of {', '.join(RULES)}, not {first!r}")
        self.rule: Rule = first
        self.switches = 0
        self.window_requests = window_tokens * max(1, n_moe)
        self.margin_permille = margin_permille
        self._seen = 0
        self._wanted = 0
        self._hits: dict[Rule, int] = dict.fromkeys(RULES, 0)

    def observe(self, wanted: int, hits: Mapping[Rule, int]) -> bool:
        """One decode request wanting ``wanted`` entries, of which each ghost hit
        ``hits[rule]``. True when the window it ends hands the cache to another rule."""
        self._seen += 1
        self._wanted += wanted
        for rule in RULES:
            self._hits[rule] += hits[rule]
        if self._seen < self.window_requests:
            return False
        window, total = self._hits, self._wanted
        self._seen = 0
        self._wanted = 0
        self._hits = dict.fromkeys(RULES, 0)
        leader = self.rule
        for rule in RULES:
            if window[rule] > window[leader]:
                leader = rule
        if leader == self.rule or (window[leader] - window[self.rule]) * 1000 <= self.margin_permille * total:
            return False
        self.rule = leader
        self.switches += 1
        return True
