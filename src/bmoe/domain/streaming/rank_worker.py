"""Whether a decode layer's rankings (the stale gate, route-ahead's commitment) are made on a
worker thread while the eval thread serves the layer's load.

The worker only pays where a CPU is free beside llama.cpp's compute threads: on 2 CPUs with 2
compute threads it took the ranking (1.2 ms/token on the bench model) off the eval thread and
added as much handing it over (docs/benchmarks.md). ``BMOE_RANK_WORKER=1`` or ``0`` decides
instead (A/B runs). The decisions are the same either way (the reads are issued at the same
point).
"""

from __future__ import annotations


def rank_on_worker(setting: str | None, cpus: int, compute_threads: int) -> bool:
    """``setting``: the environment's ``"1"`` or ``"0"``, else None (decide by the CPUs)."""
    if setting in ("0", "1"):
        return setting == "1"
    return cpus > compute_threads
