"""When a writer whose files are only a cache tries its disk again, and what it says.

A file bmoe writes for its own sake (a prompt state on ``--cache-disk``, a usage profile)
may fail for the disk's sake: no space, a read-only folder, a permission, an I/O error.
The request that made it has its answer already, so the failure is not the request's; but
trying again on every token would hammer a full disk and say so a thousand times. This
policy decides it (pure: the clock is the caller's):

- the first failure of a run of them gives **one** warning line (the folder, the error,
  what was not kept) and a wait before the next try: ``first_wait_s``, doubling at each
  failed try up to ``max_wait_s``;
- while waiting, a write is not tried (``may_try`` is False) and is only counted;
- the first write that works again gives one line saying so (and how many were not kept).

``check_valid`` asserts its invariants (a hypothesis-driven test checks them).
"""

from __future__ import annotations

import attrs

FIRST_WAIT_S = 2.0
MAX_WAIT_S = 300.0


@attrs.define
class WriteHealth:
    """One writer's state: working, or failing since a warning and waiting to try again."""

    first_wait_s: float = FIRST_WAIT_S
    max_wait_s: float = MAX_WAIT_S
    failing: bool = False
    wait_s: float = 0.0  # the wait after the last failed try (0 while working)
    retry_at: float = 0.0  # the clock's time before which nothing is tried
    not_kept: int = 0  # writes that failed or were not tried since the run of failures began
    warnings: int = 0  # warning lines given (one per run of failures)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.first_wait_s <= self.max_wait_s:
            raise ValueError("the waits must satisfy 0 < first_wait_s <= max_wait_s")

    def may_try(self, now: float) -> bool:
        """Whether a write should be tried at ``now``; a write not tried counts as not kept."""
        if not self.failing or now >= self.retry_at:
            return True
        self.not_kept += 1
        return False

    def failed(self, now: float, folder: str, error: str, what: str) -> str | None:
        """A try at ``now`` failed for the disk's sake: the warning line to give (the first
        failure of a run), else None."""
        self.not_kept += 1
        self.wait_s = min(self.max_wait_s, self.wait_s * 2) if self.failing else self.first_wait_s
        self.retry_at = now + self.wait_s
        if self.failing:
            return None
        self.failing = True
        self.warnings += 1
        return (
            f"bmoe: warning: cannot write to {folder}: {error}; {what} not kept "
            f"(bmoe goes on without it, tries again in {self.wait_s:g} s and backs off while it fails)"
        )

    def succeeded(self, folder: str) -> str | None:
        """A write worked: the line saying writes work again (after a run of failures), else None."""
        if not self.failing:
            return None
        line = f"bmoe: writes to {folder} work again ({self.not_kept} not kept meanwhile)"
        self.failing, self.wait_s, self.retry_at, self.not_kept = False, 0.0, 0.0, 0
        return line

    def check_valid(self) -> None:
        assert self.failing == (self.wait_s > 0), (self.failing, self.wait_s)
        assert self.wait_s == 0 or self.first_wait_s <= self.wait_s <= self.max_wait_s
        assert self.failing or self.not_kept == 0
        assert self.not_kept >= 0 and self.warnings >= 0
