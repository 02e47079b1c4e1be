"""Shared fixtures of the gate tests: the tiny generated models.

Models come from :func:`bmoe.testing.fixtures.fixture_path`, i.e. the user
cache (``$BMOE_FIXTURE_DIR`` or ``~/.cache/bmoe/fixtures``), so a rerun does
not rebuild them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.testing.fixtures import FIXTURES, fixture_path

TinyModelPath = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_model_path() -> TinyModelPath:
    """``tiny_model_path(name, seed=0)``: the (first shard) path of a cached fixture build."""

    @functools.cache
    def get(name: str, seed: int = 0) -> Path:
        return fixture_path(name, seed)

    return get


@pytest.fixture(scope="session", params=sorted(FIXTURES))
def fixture_name(request: pytest.FixtureRequest) -> str:
    """Each fixture name in turn (tests using it run once per tiny model)."""
    return str(request.param)
