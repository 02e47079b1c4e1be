"""Whether llama.cpp's AMX kernels may hold the weights: the policy, apart from the probe.

llama.cpp's CPU backend offers an ``AMX`` buffer type where it was built for AMX and Linux
granted the tile state, and its loader puts every weight AMX can compute in it, before
``CPU_REPACK``. Some machines grant everything and still fault on the tile instructions
(a VM whose host does not save the tile data): there llama.cpp dies in its first batched
matmul. So the AMX buffer type is used only where a probe *ran* the tile instructions
(``bmoe.adapters.cpu_features``), or where the user says so:

- ``--amx auto`` (the default): AMX where llama.cpp offers it and the probe ran it;
- ``--amx on``: AMX wherever llama.cpp offers it, no probe (a probe that is wrong);
- ``--amx off``: never AMX. bmoe places the weights itself in llama.cpp's other extra
  buffer types (``CPU_REPACK``), as it does for streaming, even where llama.cpp offers no
  AMX (there the placement is stock's, through bmoe's path).

A refused AMX is never silent: ``AmxChoice.note`` is the one line the ``mode:`` line and
``BMOE_READY`` carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs

from bmoe.errors import ConfigError

AmxMode = Literal["auto", "on", "off"]
AMX_MODES: tuple[AmxMode, ...] = ("auto", "on", "off")
AMX_BUFT_NAME = "AMX"


@attrs.frozen
class AmxVerdict:
    """What running the tile instructions gave: ``usable``, and ``why`` in words (what ran,
    what faulted, what the CPU and the OS said beside it)."""

    usable: bool
    why: str


@attrs.frozen
class AmxChoice:
    """- ``offered``: llama.cpp's CPU backend offers the AMX buffer type;
    - ``use``: weights may go to it (llama.cpp's own placement);
    - ``self_placed``: bmoe places the weights itself, AMX left out;
    - ``note``: one line saying why AMX is refused ("" when nothing is refused)."""

    offered: bool
    use: bool
    self_placed: bool = False
    note: str = ""

    @property
    def refused(self) -> tuple[str, ...]:
        """The buffer types bmoe must not place weights in."""
        return (AMX_BUFT_NAME,) if self.self_placed else ()


def check_amx_mode(mode: str) -> AmxMode:
    """``mode`` as an ``AmxMode``; ``ConfigError`` naming the choices otherwise."""
    for known in AMX_MODES:
        if mode == known:
            return known
    raise ConfigError(f"--amx must be one of {', '.join(AMX_MODES)}, not {mode!r}")


def choose_amx(mode: AmxMode, offered: bool, probe: Callable[[], AmxVerdict]) -> AmxChoice:
    """The choice for ``mode`` where llama.cpp ``offered`` AMX or not; ``probe`` is called
    only where its answer decides (auto, AMX offered)."""
    if mode == "off":
        note = "AMX off (--amx off)" if offered else ""
        return AmxChoice(offered=offered, use=False, self_placed=True, note=note)
    if not offered:
        return AmxChoice(offered=False, use=False)
    if mode == "on":
        return AmxChoice(offered=True, use=True)
    verdict = probe()
    if verdict.usable:
        return AmxChoice(offered=True, use=True)
    return AmxChoice(
        offered=True,
        use=False,
        self_placed=True,
        note=f"AMX refused: {verdict.why} (--amx on uses it anyway)",
    )
