"""Whether a decode layer's rankings (the stale gate, route-ahead's commitment) are made on a
worker thread while the eval thread serves the layer's load.

The worker only pays where a CPU is free beside llama.cpp's compute threads: on 2 CPUs with 2
compute threads it took the ranking (1.2 ms/token on the bench model) off the eval thread and
added as much handing it over (docs/benchmarks.md). ``EngineOptions.rank_worker``
(``BMOE_RANK_WORKER=1`` or ``0``) decides instead (A/B runs). The decisions are the same either
way (the reads are issued at the same point).
"""

from __future__ import annotations


def rank_on_worker(setting: bool | None, cpus: int, compute_threads: int) -> bool:
    """``setting``: what the engine options say, None to decide by the CPUs."""
    if setting is not None:
        return setting
    return cpus > compute_threads
