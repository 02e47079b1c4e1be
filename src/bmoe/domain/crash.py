"""The line a process prints when it dies of a signal (``bmoe.cext.crash_signal``): the
words, apart from the handler.

``bmoe: the process died of SIGSEGV while running gemma3.gguf (weights in AMX, CPU_REPACK);
--amx off or --no-repack avoids llama.cpp's extra kernels (docs/machines.md)``
"""

from __future__ import annotations

from collections.abc import Iterable

CRASH_PREFIX = "bmoe: the process died of "
"""How the line begins; the signal's name and ``crash_text``'s words follow."""

# llama.cpp's CPU buffer types whose kernels a flag turns off, and the flag
_AVOIDED_BY = {"AMX": "--amx off", "CPU_REPACK": "--no-repack"}


def crash_text(doing: str, buffer_types: Iterable[str]) -> str:
    """What follows the signal's name: what the process was doing (``running x.gguf``), the
    buffer types holding the weights, the flags that avoid the ones a flag can avoid."""
    types = list(dict.fromkeys(buffer_types))
    text = f" while {doing}"
    if types:
        text += f" (weights in {', '.join(types)})"
    flags = [_AVOIDED_BY[t] for t in _AVOIDED_BY if t in types]
    if "AMX" in types and "--no-repack" not in flags:
        flags.append("--no-repack")
    if flags:
        text += f"; {' or '.join(flags)} avoids llama.cpp's extra kernels"
    return text + " (docs/machines.md)"


def crash_line_in(lines: Iterable[str]) -> str | None:
    """The crash line among a process's stderr lines, or None."""
    for line in lines:
        if line.startswith(CRASH_PREFIX):
            return line
    return None
