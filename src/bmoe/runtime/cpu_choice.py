"""Which of llama.cpp's CPU buffer types a session may use: the AMX choice, wired.

The policy is ``bmoe.domain.cpu_features.choose_amx``; here it meets what this llama.cpp
offers (``repack.offered_buffer_types``) and what this machine does when it runs the tile
instructions (``cpu_features.probe_amx``, cached). The probe runs only where its answer
decides: ``--amx auto`` and llama.cpp offering AMX.
"""

from __future__ import annotations

from bmoe.adapters.cpu_features import probe_amx
from bmoe.adapters.llama.log import ensure_backend
from bmoe.adapters.llama.repack import offered_buffer_types
from bmoe.domain.cpu_features import AMX_BUFT_NAME, AmxChoice, AmxMode, choose_amx


def amx_choice(mode: AmxMode, repack: bool) -> AmxChoice:
    """The session's AMX choice; with ``repack`` off no extra buffer type is used at all, so
    nothing is probed or refused."""
    if not repack:
        return AmxChoice(offered=False, use=False)
    ensure_backend()
    return choose_amx(mode, AMX_BUFT_NAME in offered_buffer_types(), probe_amx)
