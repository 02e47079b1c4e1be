"""The combination rules of reading ahead, dropping and substituting: each refusal is a
clear start-up error (ConfigError), each allowed combination builds."""

from __future__ import annotations

import pytest

from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ConfigError


def on(**kw: object) -> StreamConfig:
    return StreamConfig(enabled=True, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"predict_prefetch": True, "cache_mb": 0}, "--predict-prefetch need"),
        ({"drop_cold": 0.75, "cache_mb": 0}, "--drop-cold-experts need"),
        ({"substitute": 0.1, "cache_mb": 0}, "--expert-substitute need"),
        ({"predict_prefetch": True, "prefetch": 1}, "exclude each other"),
        ({"route_ahead": 1, "prefetch": 1}, "--route-ahead excludes --prefetch"),
        ({"route_ahead": 2, "predict_prefetch": True}, "--route-ahead excludes --predict-prefetch"),
        ({"route_ahead": 1, "predict_log": True}, "--route-ahead excludes --predict-log"),
        ({"route_ahead": -1}, "--route-ahead must be >= 0"),
        ({"drop_cold": 1.5}, r"must be in \[0, 1\]"),
        ({"substitute": -0.1}, "--expert-substitute must be >= 0"),
        ({"predict_prefetch": True, "predict_spec_max": 0}, "--predict-spec-max must be >= 1"),
        ({"predict_prefetch": True, "predict_depth": 5}, "--predict-depth must be in 1..4"),
        ({"route_trace": "r.csv", "policy": "reference"}, "reference does not write traces"),
        ({"io_trace": "io.csv", "policy": "reference"}, "reference does not write traces"),
    ],
)
def test_refused_combinations(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        on(**settings)


def test_routing_flags_need_streaming() -> None:
    with pytest.raises(ConfigError, match="--route-ahead need"):
        StreamConfig(route_ahead=1)


@pytest.mark.parametrize(
    "settings",
    [
        {"route_ahead": 2, "cache_mb": 0},  # route-ahead without the cache: quality only
        {"route_ahead": 1, "drop_cold": 0.75},
        {"predict_prefetch": True, "predict_log": True, "drop_cold": 0.5},
        {"prefetch": 1, "substitute": 0.05},
        {"prefetch": 1, "predict_log": True},
        {"prefetch": 2, "policy": "reference"},
        {"route_ahead": 1, "drop_cold": 0.75, "policy": "reference"},
        {"predict_prefetch": True, "predict_log": True, "policy": "reference"},
        {"prefetch": 1, "substitute": 0.05, "policy": "reference"},
    ],
)
def test_allowed_combinations(settings: dict[str, object]) -> None:
    on(**settings)
