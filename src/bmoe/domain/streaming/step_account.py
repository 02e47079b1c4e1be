"""Where a streamed decode step's milliseconds go.

A streamed step is longer than a resident one by more than its wait for reads: the step is

    compute + waiting for reads + the cache's management

and the compute itself is longer than a resident step's where the read lanes' CPU work (the
kernel's ``O_DIRECT`` path, llama.cpp's repack of each expert as it lands, page faults on
fresh slices) runs on the cores the compute threads use. This module splits one decode's
figures so (``StepAccount``), per token and per MiB read:

- ``waiting``: the eval thread waiting for reads (``stall_s``);
- ``mgmt``: the cache's bookkeeping on the eval thread (``mgmt_s``);
- ``compute``: the rest of the step; where a resident step was measured in the same run
  (the bench), split into that resident step and ``over_resident``, the part of the compute a
  resident step does not pay (``None`` where none was measured);
- what the lanes spent meanwhile: ``lane_cpu`` (the worker lanes' own CPU time, user and
  system), ``landing`` (copying or repacking each projection into its slice, any lane,
  the eval thread's own reads included) and ``system`` (the whole process's system time).

Pure arithmetic on ``StreamReport``; the ``moe-stream:`` line and the bench report print it.
"""

from __future__ import annotations

import attrs

from bmoe.domain.streaming.counters import StreamReport


@attrs.frozen
class StepAccount:
    """One decode's step, split (seconds per token; ``read_mib`` a token)."""

    step_s: float
    waiting_s: float
    mgmt_s: float
    compute_s: float
    lane_cpu_s: float
    landing_s: float
    system_s: float
    read_mib: float
    resident_step_s: float | None = None

    @classmethod
    def of(cls, report: StreamReport, resident_step_s: float | None = None) -> StepAccount:
        """The split of ``report``'s decode (``resident_step_s``: a resident step of the same
        model measured in the same run, where there is one)."""
        d = report.decode
        return cls(
            step_s=report.per_token(report.decode_wall_s),
            waiting_s=report.stall_s_tok,
            mgmt_s=report.mgmt_s_tok,
            compute_s=report.compute_s_tok,
            lane_cpu_s=report.per_token(d.lane_cpu_s),
            landing_s=report.per_token(d.land_s),
            system_s=report.per_token(d.system_s),
            read_mib=report.read_mib_tok,
            resident_step_s=resident_step_s,
        )

    @property
    def over_resident_s(self) -> float | None:
        """The compute beyond a resident step (None where none was measured)."""
        if self.resident_step_s is None:
            return None
        return self.compute_s - self.resident_step_s

    def per_mib(self, seconds: float | None) -> float | None:
        """``seconds`` a token per MiB read a token (None where nothing was read)."""
        if seconds is None or self.read_mib <= 0:
            return None
        return seconds / self.read_mib

    def text(self) -> str:
        """``lanes' CPU 40.0 ms/token (0.301 ms/MiB read) (landing 20.0, the process's system
        time 30.0)`` and, with a resident step, ``; compute 100.0 = resident 30.0 + 70.0 over
        it (0.526 ms/MiB read)``."""
        line = (
            f"lanes' CPU {1000 * self.lane_cpu_s:.1f} ms/token"
            + _per_mib(self.per_mib(self.lane_cpu_s))
            + f" (landing {1000 * self.landing_s:.1f}, the process's system time {1000 * self.system_s:.1f})"
        )
        over = self.over_resident_s
        if over is not None and self.resident_step_s is not None:
            line += (
                f"; compute {1000 * self.compute_s:.1f} = resident {1000 * self.resident_step_s:.1f} "
                f"+ {1000 * over:.1f} over it" + _per_mib(self.per_mib(over))
            )
        return line


def _per_mib(seconds: float | None) -> str:
    return "" if seconds is None else f" ({1000 * seconds:.3f} ms/MiB read)"
