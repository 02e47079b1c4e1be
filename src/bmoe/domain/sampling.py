"""How the next token is chosen."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from bmoe.errors import ConfigError


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0, not {value}")


def _finite(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{attribute.name} must be finite, not {value}")


def _bias_pairs(value: Iterable[tuple[int, float]] | Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    """Token id and bias pairs (or a mapping of them), sorted by token."""
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((int(token), float(bias)) for token, bias in items))


@attrs.frozen
class SamplingParams:
    """Greedy by default (``temp`` 0). With ``temp > 0``: top-k, top-p, temperature, seeded draw.

    ``top_k`` 0 and ``top_p`` 1.0 turn those filters off. The same seed and settings give the
    same tokens. Before any of them, in llama.cpp's order: ``logit_bias`` (token id, value
    added to its logit) and the ``frequency_penalty`` / ``presence_penalty`` of tokens this
    generation already produced (OpenAI's meaning; 0 is off). At their defaults none of
    these adds a sampler: the chain is exactly the plain one.
    """

    temp: float = attrs.field(default=0.0, validator=_non_negative)
    top_k: int = attrs.field(default=40, validator=_non_negative)
    top_p: float = attrs.field(default=0.95, validator=_non_negative)
    seed: int = attrs.field(default=0, validator=_non_negative)
    frequency_penalty: float = attrs.field(default=0.0, validator=_finite)
    presence_penalty: float = attrs.field(default=0.0, validator=_finite)
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_bias_pairs)

    def __attrs_post_init__(self) -> None:
        if self.top_p > 1.0:
            raise ConfigError(f"top_p must be in [0, 1], not {self.top_p}")
        for token, bias in self.logit_bias:
            if token < 0 or not math.isfinite(bias):
                raise ConfigError(f"logit_bias: token {token} bias {bias} (a token id >= 0, a finite bias)")

    @property
    def penalised(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0
