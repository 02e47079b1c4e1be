"""The CPU a session runs on: which of llama.cpp's CPU buffer types it may use (the AMX
choice, wired), and whether the machine looks too busy for the threads asked (the warning).

The AMX policy is ``bmoe.domain.cpu_features.choose_amx``; here it meets what this llama.cpp
offers (``repack.offered_buffer_types``) and what this machine does when it runs the tile
instructions (``cpu_features.probe_amx``, cached). The probe runs only where its answer
decides: ``--amx auto`` and llama.cpp offering AMX. The busy rule is
``bmoe.domain.threads.busy_machine_note``.
"""

from __future__ import annotations

import os

from bmoe.adapters.cpu_features import probe_amx
from bmoe.adapters.cpu_topology import machine_load, other_cpu_busy
from bmoe.adapters.llama.log import ensure_backend
from bmoe.adapters.llama.repack import offered_buffer_types
from bmoe.domain.cpu_features import AMX_BUFT_NAME, AmxChoice, AmxMode, choose_amx
from bmoe.domain.threads import busy_machine_note


def amx_choice(mode: AmxMode, repack: bool) -> AmxChoice:
    """The session's AMX choice; with ``repack`` off no extra buffer type is used at all, so
    nothing is probed or refused."""
    if not repack:
        return AmxChoice(offered=False, use=False)
    ensure_backend()
    return choose_amx(mode, AMX_BUFT_NAME in offered_buffer_types(), probe_amx)


def busy_note(threads: int) -> str | None:
    """The busy-machine warning (None: none, or ``BMOE_BUSY_WARNING=0``): only where the load
    average says the machine may be busy is the CPU sampled (0.2 s), and that sample decides."""
    if os.environ.get("BMOE_BUSY_WARNING", "1") == "0":
        return None
    cpus, load = machine_load()
    if busy_machine_note(threads, cpus, load) is None:
        return None
    busy = other_cpu_busy()
    return busy_machine_note(threads, cpus, busy) if busy is not None else None
