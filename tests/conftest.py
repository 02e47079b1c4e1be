"""Settings shared by every test."""

from __future__ import annotations

from hypothesis import settings

# Property tests check behaviour, not speed: on a loaded 2-CPU machine (CI builds, other
# jobs) an example can take longer than hypothesis's default 200 ms deadline, which would
# fail a correct test as "flaky". Speed is measured by the benchmarks, not here.
settings.register_profile("bmoe", deadline=None, print_blob=True)
settings.load_profile("bmoe")
