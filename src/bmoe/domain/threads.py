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


def busy_machine_note(threads: int, cores: int, busy: float, what: str = "other work keeps") -> str | None:
    """A warning when other work keeps so many of the ``cores`` busy that fewer are free than
    ``threads`` asks for (``None``: enough are free). llama.cpp's threads spin while they
    wait for one another, so one that shares its core with another job holds all of them
    back: on a 2-core VM with a job beside it, 2 threads decoded the built-in model at 1.06 s
    a token and ``-t 1`` at 97.7 tok/s (stock llama.cpp does the same). ``busy``: CPUs busy
    with other work (a short sample while this process sleeps; the load average alone
    lingers a minute after a run of one's own, and would warn of it)."""
    free = max(0, round(cores - busy))
    if threads <= free:
        return None
    suggest = max(1, free)
    return (
        f"threads: warning: the machine is busy ({what} {busy:.1f} of {cores} cores busy, {free} free) "
        f"and -t {threads} asks for more; llama.cpp's threads wait for the slowest, so decoding "
        f"may run many times slower: try -t {suggest}"
    )
