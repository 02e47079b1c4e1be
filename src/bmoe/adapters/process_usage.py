"""This process's minor page faults and system CPU time so far (``getrusage``: every thread,
llama.cpp's and the read lanes'): what the read path costs the kernel, beside the reads."""

from __future__ import annotations

import resource


def faults_and_system() -> tuple[int, float]:
    """``(minor page faults, system CPU seconds)`` of this process since it started."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_minflt, use.ru_stime
