"""The crash line armed for this process: ``bmoe.cext.crash_signal``'s handler, given the
words of ``bmoe.domain.crash`` for what runs now."""

from __future__ import annotations

from collections.abc import Iterable

from bmoe.cext import crash_signal
from bmoe.domain.crash import crash_text


def arm(doing: str, buffer_types: Iterable[str] = ()) -> None:
    """From now on a fatal signal prints the line for ``doing`` and ``buffer_types``."""
    crash_signal.install()
    crash_signal.set_text(crash_text(doing, buffer_types))
