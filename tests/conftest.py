"""Settings shared by every test."""

from __future__ import annotations

import pytest
from hypothesis import settings

# Property tests check behaviour, not speed: on a loaded 2-CPU machine (CI builds, other
# jobs) an example can take longer than hypothesis's default 200 ms deadline, which would
# fail a correct test as "flaky". Speed is measured by the benchmarks, not here.
settings.register_profile("bmoe", deadline=None, print_blob=True)
settings.load_profile("bmoe")


@pytest.fixture(autouse=True)
def _own_profile_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's and the server's ``--profile auto`` learn into a folder of each test's
    own (processes a test starts inherit it), never the user's ``~/.cache/bmoe/profiles``:
    a profile left by one test would warm the next one's cache and change its counters."""
    monkeypatch.setenv("BMOE_PROFILE_DIR", str(tmp_path_factory.mktemp("profiles")))
    # the same for the expert stores ``--expert-store auto`` finds: only a test's own (the
    # output is the same either way; the counters and the notes are not)
    monkeypatch.setenv("BMOE_STORE_DIR", str(tmp_path_factory.mktemp("stores")))
    # and the plan's calibrations, whose history widens the prefill's range
    monkeypatch.setenv("BMOE_CALIBRATION_HISTORY", str(tmp_path_factory.mktemp("plan") / "calibrations.json"))
    # the busy-machine warning reads the load average, which the suite itself raises: tests
    # that count a session's notes would depend on it (its own tests set it back)
    monkeypatch.setenv("BMOE_BUSY_WARNING", "0")


def pytest_report_header() -> str:
    """Which CPU buffer types the gates meet here (AMX used, refused or absent)."""
    from bmoe.testing.machine import describe

    return describe()
