"""The prefill range's compute spread: the calibration's own tries widened by this machine's
earlier calibrations (``bmoe.domain.plan.compute_spread``), kept best effort
(``bmoe.adapters.calibration_history_file``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.adapters.calibration_history_file import read_history, write_history
from bmoe.domain.plan.compute_spread import (
    KEPT,
    MAX_AGE_S,
    CalibrationRecord,
    kept,
    recent_rates,
    spread_with_history,
    with_record,
)
from bmoe.domain.plan.prompt_rates import PromptRates

NOW = 1_800_000_000.0


def record(seconds: float, ago: float = 60.0, key: str = "here") -> CalibrationRecord:
    return CalibrationRecord(at=NOW - ago, key=key, seconds=seconds)


def test_the_history_widens_the_spread_to_its_fastest_and_slowest() -> None:
    now = record(10.0, ago=0.0)
    history = (record(8.0), record(13.0), record(11.0))
    assert spread_with_history((0.95, 1.05), now, history) == pytest.approx((0.8, 1.3))
    # the calibration's own tries, where they moved further, stand
    assert spread_with_history((0.7, 1.4), now, history) == pytest.approx((0.7, 1.4))
    assert spread_with_history((0.95, 1.05), now, ()) == (0.95, 1.05)  # a first calibration


def test_another_machine_or_an_old_calibration_is_not_this_one() -> None:
    now = record(10.0, ago=0.0)
    history = (record(5.0, key="elsewhere"), record(20.0, ago=MAX_AGE_S + 1), record(12.0))
    assert spread_with_history((1.0, 1.0), now, history) == pytest.approx((1.0, 1.2))


def test_the_newest_are_kept_for_each_key() -> None:
    history: tuple[CalibrationRecord, ...] = ()
    for i in range(KEPT + 5):
        history = with_record(history, record(float(i + 1), ago=float(KEPT + 5 - i)))
    history = with_record(history, record(3.0, key="elsewhere"))
    here = kept(history, NOW, "here")
    assert len(here) == KEPT
    assert [r.seconds for r in here] == [float(i + 1) for i in range(5, KEPT + 5)]
    assert len(kept(history, NOW, "elsewhere")) == 1


def test_the_file_keeps_the_records_and_a_bad_one_is_no_history(tmp_path: Path) -> None:
    path = tmp_path / "calibrations.json"
    assert read_history(path) == ()
    records = (record(8.0), record(9.5, key="other"))
    assert write_history(path, records)
    assert read_history(path) == records
    for text in ("not json", '{"version": 99, "records": []}', '{"version": 1, "records": [{"at": 1}]}'):
        path.write_text(text)
        assert read_history(path) == ()
    path.write_bytes(b"\xff\xfe")
    assert read_history(path) == ()


def test_a_folder_that_cannot_be_written_keeps_no_history_and_raises_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert not write_history(blocked / "calibrations.json", (record(8.0),))


def test_the_records_keep_their_prompt_rates_and_the_recent_ones_are_handed_on(tmp_path: Path) -> None:
    curve = ((1.0, 100e9), (64.0, 300e9))
    rated = CalibrationRecord(
        at=NOW - 60, key="here", seconds=9.0, matmul_curve=curve, attention_flops_s=80e9
    )
    path = tmp_path / "calibrations.json"
    old = record(8.0)  # kept before records had rates: no curve
    assert write_history(path, (old, rated, record(7.0, key="elsewhere")))
    history = read_history(path)
    assert history[1] == rated
    now = record(10.0, ago=0.0)
    assert recent_rates(now, history) == (PromptRates(curve, 80e9),)
    assert recent_rates(record(10.0, ago=0.0, key="nowhere"), history) == ()
