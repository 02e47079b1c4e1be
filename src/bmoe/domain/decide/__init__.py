"""Decisions ("choose, do not generate"): policy over token ids and a row of logits.

- :mod:`prompt_split`: where the prefix ends, on tokens;
- :mod:`choice_scorer`: the up-front choice checks and the first-token scoring;
- :mod:`prefix_cache`: the kept prefix states (``IPrefixCache``, ``LastPrefixCache``,
  ``LruPrefixCache``) and the ``auto|on|off`` policy;
- :mod:`values`: ``DecideRequest``, ``DecideConfig``, ``DecidePlan``, ``DecideResult``;
- :mod:`log_softmax`: log-probabilities from logits (shared with perplexity).

``bmoe.service.decider.run_decide`` runs one decision over an ``IDecideBackend``.
"""

from bmoe.domain.decide.choice_scorer import ChoiceScores, check_choices, first_tokens, score_choices
from bmoe.domain.decide.log_softmax import log_softmax, renormalise
from bmoe.domain.decide.prefix_cache import (
    PREFIX_CACHE_MODES,
    IPrefixCache,
    KeptState,
    LastPrefixCache,
    LruPrefixCache,
    PrefixCacheMode,
    StateBlob,
    new_prefix_cache,
    resolve_prefix_cache,
)
from bmoe.domain.decide.prompt_split import split_prefix
from bmoe.domain.decide.values import DecideConfig, DecidePlan, DecideRequest, DecideResult

__all__ = [
    "PREFIX_CACHE_MODES",
    "ChoiceScores",
    "DecideConfig",
    "DecidePlan",
    "DecideRequest",
    "DecideResult",
    "IPrefixCache",
    "KeptState",
    "LastPrefixCache",
    "LruPrefixCache",
    "PrefixCacheMode",
    "StateBlob",
    "check_choices",
    "first_tokens",
    "log_softmax",
    "new_prefix_cache",
    "renormalise",
    "resolve_prefix_cache",
    "score_choices",
    "split_prefix",
]
