"""How the next token is chosen."""

from __future__ import annotations

from typing import Any

import attrs

from bmoe.errors import ConfigError


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0, not {value}")


@attrs.frozen
class SamplingParams:
    """Greedy by default (``temp`` 0). With ``temp > 0``: top-k, top-p, temperature, seeded draw.

    ``top_k`` 0 and ``top_p`` 1.0 turn those filters off. The same seed and settings give the
    same tokens.
    """

    temp: float = attrs.field(default=0.0, validator=_non_negative)
    top_k: int = attrs.field(default=40, validator=_non_negative)
    top_p: float = attrs.field(default=0.95, validator=_non_negative)
    seed: int = attrs.field(default=0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        if self.top_p > 1.0:
            raise ConfigError(f"top_p must be in [0, 1], not {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0
