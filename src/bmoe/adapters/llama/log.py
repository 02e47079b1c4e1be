"""Route llama.cpp's log lines: to stderr when verbose, else errors only.

llama.cpp logs through one process-wide callback; bmoe installs its own so that, by
default, a run prints only what the user asked for (stdout stays clean for the protocol).
"""

from __future__ import annotations

import ctypes
import sys

import llama_cpp

_ERROR_LEVEL = 3  # GGML_LOG_LEVEL_ERROR
_CONT_LEVEL = 5  # GGML_LOG_LEVEL_CONT: continues the previous line
_state: dict[str, int] = {"verbose": 0, "last_level": 0}


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]  # ctypes CFUNCTYPE is untyped
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    effective = _state["last_level"] if level == _CONT_LEVEL else level
    _state["last_level"] = effective
    if _state["verbose"] or effective == _ERROR_LEVEL:
        sys.stderr.write(text.decode("utf-8", errors="replace"))
        sys.stderr.flush()


def set_llama_verbose(verbose: bool) -> None:
    """Show all of llama.cpp's log (True) or only its errors (False, the default)."""
    _state["verbose"] = int(verbose)
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


_backend_ready = False


def ensure_backend() -> None:
    """Initialise llama.cpp's backends once per process, with bmoe's log routing."""
    global _backend_ready
    if not _backend_ready:
        set_llama_verbose(bool(_state["verbose"]))
        llama_cpp.llama_backend_init()
        _backend_ready = True
