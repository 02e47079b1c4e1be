"""How many compute threads llama.cpp gets by default: one per physical core this process
may run on, as llama.cpp's own tools choose (``cpu_get_num_math``): a second hardware
thread of a core (SMT) shares the core's SIMD units and slows the matmuls down.

The read lanes are not subtracted: they block on the disk, and what they do on a CPU (the
copy or repack of each expert) is short. Measured on a 2-core VM, the 5.2 GiB bench model
streamed through a 1536 MiB cache: 2 compute threads prefilled 464 tokens in 6.1-7.1 s and
decoded at 61-66 ms a step, 1 thread (a core left to the lanes) in 8.7-9.3 s and 78-95 ms
(docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterable


def physical_core_count(siblings: Iterable[frozenset[int]], allowed: int) -> int:
    """The physical cores among the CPUs this process may use: ``siblings`` holds, for each
    allowed CPU, the set of CPUs sharing its core (its SMT siblings, itself included; an
    empty set where the topology is unknown, counted as a core of its own). ``allowed``
    (the number of allowed CPUs) is the answer when nothing is known; never less than 1."""
    groups: set[frozenset[int]] = set()
    unknown = 0
    for group in siblings:
        if group:
            groups.add(group)
        else:
            unknown += 1
    if not groups and not unknown:
        return max(1, allowed)
    return max(1, len(groups) + unknown)
