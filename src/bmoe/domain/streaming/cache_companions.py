"""What runs beside the live expert cache, fed the same requests, no bytes: adaptive's ghost
caches and rule chooser (``ghost_caches``, ``rule_chooser``), and the scope twin of
``--cache-victims auto`` (``scope_twin``). Made here so the policy's module holds its own
rules only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from bmoe.domain.streaming.ghost_caches import GhostCache, GhostCaches
from bmoe.domain.streaming.rule_chooser import RuleChooser
from bmoe.domain.streaming.scope_twin import ScopeTwin, TwinCache, other_scope
from bmoe.domain.streaming.victims import Victims


class CompanionCache(GhostCache, TwinCache, Protocol):
    """The reference policy, as a ghost and as a twin."""


def companions(
    make: Callable[..., CompanionCache],
    eviction: str,
    victims: Victims,
    n_moe: int,
    *,
    scope_twin: bool,
    window_tokens: int | None,
    margin_permille: int | None,
) -> tuple[GhostCaches | None, RuleChooser | None, ScopeTwin | None]:
    """``make(eviction=rule, victims=scope)``: an empty cache of the live one's budget and sizes. ``eviction``
    ``"adaptive"``: a ghost per rule (the live scope) and the chooser; ``scope_twin``: the
    twin, under the other scope and, adaptive, LFU's counts kept (it follows the rule in
    charge)."""
    ghosts = chooser = twin = None
    if eviction == "adaptive":
        ghosts = GhostCaches(lambda rule: make(eviction=rule, victims=victims))
        chooser = RuleChooser(n_moe, window_tokens=window_tokens, margin_permille=margin_permille)
    if scope_twin:
        twin_eviction = "lfu" if eviction == "adaptive" else eviction  # adaptive's: follows its rule
        twin = ScopeTwin(make(eviction=twin_eviction, victims=other_scope(victims)))
    return ghosts, chooser, twin
