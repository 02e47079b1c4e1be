"""What the tests need to know of this machine's CPU: whether llama.cpp offers AMX here,
and whether its tiles run (the probe's cached verdict).

On a machine whose AMX faults, stock llama.cpp with its defaults dies in its first batched
matmul of a quantized model: the gates run bmoe there with ``--amx off`` (``SAFE_AMX``) and
the stock oracle in a child process (``bmoe.testing.oracle``), and say so in their ids.
"""

from __future__ import annotations

from bmoe.adapters.cpu_features import probe_amx
from bmoe.adapters.llama.log import ensure_backend
from bmoe.adapters.llama.repack import offered_buffer_types
from bmoe.domain.cpu_features import AMX_BUFT_NAME, AmxMode, AmxVerdict

ensure_backend()
AMX_OFFERED: bool = AMX_BUFT_NAME in offered_buffer_types()
AMX_VERDICT: AmxVerdict | None = probe_amx() if AMX_OFFERED else None
AMX_BROKEN: bool = AMX_VERDICT is not None and not AMX_VERDICT.usable
SAFE_AMX: AmxMode = "off" if AMX_BROKEN else "auto"
SAFE_AMX_ID = "amx-off-its-tiles-fault-here" if AMX_BROKEN else "amx-auto"


def describe() -> str:
    """One line for pytest's header."""
    if not AMX_OFFERED:
        return "AMX: this llama.cpp offers no AMX buffer type here"
    assert AMX_VERDICT is not None
    if AMX_BROKEN:
        why = AMX_VERDICT.why
        return f"AMX: offered but refused ({why}): gates run bmoe with --amx off, stock in a child"
    return f"AMX: offered and used ({AMX_VERDICT.why})"
