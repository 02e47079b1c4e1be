"""What the tests need to know of this machine's CPU: whether llama.cpp offers AMX here,
and whether its AMX kernel runs right (the probe's cached verdict: the tiles, then
llama.cpp's own kernel with the gates' thread counts, as a session's ``--amx auto`` asks).

Where llama.cpp's AMX faults (the CPU's tiles, or a kernel its compiler broke), stock
llama.cpp with its defaults dies in its first batched matmul of a quantized model: the gates
run bmoe there with ``--amx off`` (``SAFE_AMX``) and the stock oracle in a child process
(``bmoe.testing.oracle``), and say so in their ids. No test runs stock llama.cpp on a
quantized model in its own process unless the probe said AMX computes right here
(``STOCK_IN_PROCESS``).
"""

from __future__ import annotations

from bmoe.domain.cpu_features import AmxMode, AmxVerdict
from bmoe.runtime.cpu_choice import amx_offered, amx_verdict

GATE_THREADS = 2
"""The thread count of the gates' contexts (the probe runs it, and 1 and 3)."""

AMX_OFFERED: bool = amx_offered()
AMX_VERDICT: AmxVerdict | None = amx_verdict(GATE_THREADS) if AMX_OFFERED else None
AMX_BROKEN: bool = AMX_VERDICT is not None and not AMX_VERDICT.usable
SAFE_AMX: AmxMode = "off" if AMX_BROKEN else "auto"
SAFE_AMX_ID = "amx-off-it-faults-here" if AMX_BROKEN else "amx-auto"
STOCK_IN_PROCESS: bool = not AMX_BROKEN
"""Stock llama.cpp with its defaults may run in the test process (else: in a child)."""


def describe() -> str:
    """One line for pytest's header."""
    if not AMX_OFFERED:
        return "AMX: this llama.cpp offers no AMX buffer type here"
    assert AMX_VERDICT is not None
    if AMX_BROKEN:
        why = AMX_VERDICT.why
        return f"AMX: offered but refused ({why}): gates run bmoe with --amx off, stock in a child"
    return f"AMX: offered and used ({AMX_VERDICT.why})"
