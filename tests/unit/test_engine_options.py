"""The engine's A/B switches: one value, read from the ``BMOE_*`` variables in one place, with
clear errors for values that are not a choice."""

from __future__ import annotations

import pytest

from bmoe.domain.streaming import EngineOptions, StreamConfig
from bmoe.errors import ConfigError


def test_no_variable_gives_the_defaults() -> None:
    assert EngineOptions.from_environ({}) == EngineOptions()
    assert EngineOptions.from_environ({"BMOE_PAGE_RELEASE": ""}) == EngineOptions()


def test_each_variable_sets_its_option() -> None:
    options = EngineOptions.from_environ(
        {
            "BMOE_PROJECTION_WAITS": "0",
            "BMOE_ORPHAN_READS": "0",
            "BMOE_RANK_WORKER": "1",
            "BMOE_PAGE_RECYCLE": "0",
            "BMOE_PAGE_RELEASE": "all",
            "BMOE_REPACK_PARTS": "dense",
            "BMOE_WAKE_LANES": "all",
            "BMOE_EXPERT_ROWS": "shuffled",
            "UNRELATED": "x",
        }
    )
    assert options == EngineOptions(
        projection_waits=False,
        orphan_reads=False,
        rank_worker=True,
        page_recycle=False,
        page_release="all",
        repack_parts="dense",
        wake_lanes="all",
        expert_rows="shuffled",
    )


def test_the_rank_worker_is_left_to_the_cpus_unless_set() -> None:
    assert EngineOptions.from_environ({}).rank_worker is None
    assert EngineOptions.from_environ({"BMOE_RANK_WORKER": "0"}).rank_worker is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BMOE_PROJECTION_WAITS", "yes"),
        ("BMOE_RANK_WORKER", "2"),
        ("BMOE_PAGE_RELEASE", "later"),
        ("BMOE_REPACK_PARTS", "none"),
        ("BMOE_WAKE_LANES", "some"),
        ("BMOE_EXPERT_ROWS", "mine"),
    ],
)
def test_a_value_that_is_not_a_choice_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        EngineOptions.from_environ({name: value})


def test_fields_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="page_release"):
        EngineOptions(page_release="later")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="wake_lanes"):
        EngineOptions(wake_lanes="some")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="expert_rows"):
        EngineOptions(expert_rows="mine")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lane_delay_us"):
        EngineOptions(lane_delay_us=-1)


def test_the_stream_config_carries_them_for_developers_only() -> None:
    assert StreamConfig().engine is None  # the environment decides
    slow = StreamConfig(enabled=True, engine=EngineOptions(lane_delay_us=10))
    assert slow.engine is not None and slow.engine.lane_delay_us == 10
