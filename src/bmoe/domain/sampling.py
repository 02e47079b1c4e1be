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
    """Greedy by default (``temp`` 0). With ``temp > 0``: top-k, top-p, min-p, temperature,
    seeded draw.

    ``top_k`` 0, ``top_p`` 1.0 and ``min_p`` 0 turn those filters off. The same seed and
    settings give the same tokens. Before any of them, in llama.cpp's order: ``logit_bias``
    (token id, value added to its logit) and the penalties of tokens this generation already
    produced: ``repeat_penalty`` (llama.cpp's: a positive logit divided by it, a negative one
    multiplied; 1.0 is off), ``frequency_penalty`` / ``presence_penalty`` (OpenAI's meaning;
    0 is off), over the last ``penalty_last_n`` tokens (-1: the whole context). At their
    defaults none of these adds a sampler: the chain is exactly the plain one.
    """

    temp: float = attrs.field(default=0.0, validator=_non_negative)
    top_k: int = attrs.field(default=40, validator=_non_negative)
    top_p: float = attrs.field(default=0.95, validator=_non_negative)
    seed: int = attrs.field(default=0, validator=_non_negative)
    frequency_penalty: float = attrs.field(default=0.0, validator=_finite)
    presence_penalty: float = attrs.field(default=0.0, validator=_finite)
    repeat_penalty: float = attrs.field(default=1.0, validator=_finite)
    penalty_last_n: int = -1
    min_p: float = attrs.field(default=0.0, validator=_non_negative)
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_bias_pairs)

    def __attrs_post_init__(self) -> None:
        if self.top_p > 1.0:
            raise ConfigError(f"top_p must be in [0, 1], not {self.top_p}")
        if self.min_p > 1.0:
            raise ConfigError(f"min_p must be in [0, 1], not {self.min_p}")
        if self.repeat_penalty <= 0.0:
            raise ConfigError(f"repeat_penalty must be > 0, not {self.repeat_penalty}")
        if self.penalty_last_n < -1:
            raise ConfigError(
                f"penalty_last_n must be -1 (the whole context) or >= 0, not {self.penalty_last_n}"
            )
        for token, bias in self.logit_bias:
            if token < 0 or not math.isfinite(bias):
                raise ConfigError(f"logit_bias: token {token} bias {bias} (a token id >= 0, a finite bias)")

    @property
    def penalised(self) -> bool:
        return self.penalty_last_n != 0 and (
            self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repeat_penalty != 1.0
        )

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0
