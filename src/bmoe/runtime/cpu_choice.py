"""The CPU a session runs on: which of llama.cpp's CPU buffer types it may use (the AMX
choice, wired), and whether the machine looks too busy for the threads asked (the warning).

The AMX policy is ``bmoe.domain.cpu_features.choose_amx``; here it meets what this llama.cpp
offers (``repack.offered_buffer_types``) and what this machine does when it runs the tile
instructions and then llama.cpp's own AMX kernel (``cpu_features.probe_amx`` with the kernel
step of ``bmoe.adapters.amx_kernel`` on ``bmoe.tinymodel.probe_models``, cached). The probe
runs only where its answer decides: ``--amx auto`` and llama.cpp offering AMX. The busy rule
is ``bmoe.domain.threads.busy_machine_note``.

For the tests, on any machine: ``BMOE_AMX_PRETEND_OFFERED=1`` makes AMX count as offered
and the tiles as run, so that the kernel step decides (it finds no weight in AMX: refused),
and ``BMOE_AMX_PROBE_FAULT`` injects a fault into the kernel step (``amx_kernel.FAULTS``).
Both are part of the cached verdict's key.
"""

from __future__ import annotations

import os

from bmoe.adapters.amx_kernel import FAULT_ENV, run_kernel_probe
from bmoe.adapters.cpu_features import probe_amx
from bmoe.adapters.cpu_topology import machine_load, other_cpu_busy
from bmoe.adapters.llama.log import ensure_backend
from bmoe.adapters.llama.repack import offered_buffer_types
from bmoe.domain.amx_kernel import KernelReport
from bmoe.domain.cpu_features import AMX_BUFT_NAME, AmxChoice, AmxMode, AmxVerdict, choose_amx
from bmoe.domain.threads import busy_machine_note

PRETEND_ENV = "BMOE_AMX_PRETEND_OFFERED"
PROBE_THREADS = (1, 3)
"""Besides the session's own count: one thread, and an odd number."""


def _pretending() -> bool:
    return os.environ.get(PRETEND_ENV) == "1"


def amx_offered() -> bool:
    """llama.cpp's CPU backend offers the AMX buffer type here (or the tests pretend so)."""
    ensure_backend()
    return AMX_BUFT_NAME in offered_buffer_types() or _pretending()


def _kernel_step(threads: tuple[int, ...]) -> KernelReport:
    # imported here: the model generator is needed once per machine, not at every start
    from bmoe.tinymodel.probe_models import probe_models

    return run_kernel_probe(probe_models(), threads)


def amx_verdict(threads: int) -> AmxVerdict:
    """Whether AMX runs right here with ``threads`` (and with 1 and 3): the cached verdict,
    else the tiles then llama.cpp's kernel run now."""
    pretend = _pretending()
    variant = f"pretend={int(pretend)};fault={os.environ.get(FAULT_ENV, '')}"
    tiles = AmxVerdict(True, f"the tiles were not run ({PRETEND_ENV}=1)") if pretend else None
    return probe_amx(kernel=_kernel_step, threads=(*PROBE_THREADS, threads), variant=variant, tiles=tiles)


def amx_choice(mode: AmxMode, repack: bool, threads: int) -> AmxChoice:
    """The session's AMX choice for a context of ``threads``; with ``repack`` off no extra
    buffer type is used at all, so nothing is probed or refused."""
    if not repack:
        return AmxChoice(offered=False, use=False)
    return choose_amx(mode, amx_offered(), lambda: amx_verdict(threads))


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
