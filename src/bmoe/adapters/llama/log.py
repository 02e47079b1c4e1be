"""Route llama.cpp's log lines: to stderr when verbose, else errors only.

llama.cpp logs through one process-wide callback; bmoe installs its own so that, by
default, a run prints only what the user asked for (stdout stays clean for the protocol).
The callback also reads one figure out of the log: the compute buffer llama.cpp reserves
for a context (``capture_compute_buffers``), which no C function of its API reports, and
the KV cache's (``capture_kv_buffers``).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import sys
import threading
from collections.abc import Callable, Iterator

import llama_cpp

from bmoe.cext import log_filter

_ERROR_LEVEL = 4  # GGML_LOG_LEVEL_ERROR (3 is WARN)
_CONT_LEVEL = 5  # GGML_LOG_LEVEL_CONT: continues the previous line
# What llama.cpp logs as errors when a decode is aborted through the abort callback (a
# cancel, or a streaming fault): bmoe reports those itself, as a cancelled result or a typed
# error, so these lines are not shown (GGML_STATUS_ABORTED is 1; llama_decode returns 2).
_ABORTED = re.compile(
    rb"(graph_compute: ggml_backend_sched_graph_compute_async failed with error 1"
    rb"|process_ubatch: failed to compute graph, compute status: 1"
    rb"|llama_decode: failed to decode, ret = 2)\s*$"
)
_state: dict[str, int] = {"verbose": 0, "last_level": 0}
# llama_context::sched_reserve, once per backend whose buffer holds more than a byte:
# "sched_reserve:        CPU compute buffer size =     0.25 MiB"
# llama_model_loader, once per buffer the weights were loaded into:
# "load_tensors:   CPU_REPACK model buffer size =  1336.00 MiB"
# and llama_kv_cache, once per buffer of each KV cache (two caches where a model has
# sliding-window layers: their sizes add up):
# "llama_kv_cache:        CPU KV buffer size =   128.00 MiB"
_BUFFER_SIZES = {
    "compute": re.compile(rb"(\S+) compute buffer size = +([0-9]+(?:\.[0-9]+)?) MiB"),
    "model": re.compile(rb"(\S+) model buffer size = +([0-9]+(?:\.[0-9]+)?) MiB"),
    "kv": re.compile(rb"(\S+) KV buffer size = +([0-9]+(?:\.[0-9]+)?) MiB"),
}
_ADDED = ("kv",)  # kinds whose lines add up; a later line of the others replaces an earlier one
_capture = threading.local()  # .compute, .model, .kv: the dicts the calling thread's captures fill


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]  # ctypes CFUNCTYPE is untyped
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    effective = _state["last_level"] if level == _CONT_LEVEL else level
    _state["last_level"] = effective
    for kind, pattern in _BUFFER_SIZES.items():
        found = getattr(_capture, kind, None)
        if found is not None:
            match = pattern.search(text)
            if match:  # a later reservation replaces an earlier one of the same backend
                name = match.group(1).decode("utf-8", errors="replace")
                size = round(float(match.group(2)) * 1048576)
                found[name] = found.get(name, 0) + size if kind in _ADDED else size
    errors = getattr(_capture, "errors", None)
    if errors is not None and effective == _ERROR_LEVEL:
        errors.append(text.decode("utf-8", errors="replace").strip())
    if shown(effective, text):
        sys.stderr.write(text.decode("utf-8", errors="replace"))
        sys.stderr.flush()


def shown(level: int, text: bytes) -> bool:
    """Whether a llama.cpp log line goes to stderr: everything when verbose, else errors but
    the ones an aborted decode logs."""
    if _state["verbose"]:
        return True
    return level == _ERROR_LEVEL and not _ABORTED.search(text)


def capture_compute_buffers() -> contextlib.AbstractContextManager[dict[str, int]]:
    """Around creating a context: the compute buffers llama.cpp logs that it reserved, in
    bytes per backend (``{"CPU": 263680}``; empty if it logged none). Only lines logged by
    the calling thread count (llama.cpp reserves synchronously, in the creating thread), so
    contexts created at once in other threads do not mix in. The figure is the log's, to
    0.01 MiB."""
    return _capturing("compute")


def capture_kv_buffers() -> contextlib.AbstractContextManager[dict[str, int]]:
    """Around creating a context: its KV cache's buffers, in bytes per backend (every cache's
    together); as ``capture_compute_buffers``, only the calling thread's lines."""
    return _capturing("kv")


def capture_model_buffers() -> contextlib.AbstractContextManager[dict[str, int]]:
    """Around loading a model: the buffers llama.cpp loaded the weights into, in bytes per
    buffer type (``{"CPU_Mapped": ..., "CPU_REPACK": ...}``), as its log says them; as
    ``capture_compute_buffers``, only the calling thread's lines."""
    return _capturing("model")


@contextlib.contextmanager
def capture_errors() -> Iterator[list[str]]:
    """Around a call that fails by returning NULL (``mtmd_init_from_file``): the error lines
    llama.cpp and mtmd logged meanwhile, from the calling thread, to say why."""
    found: list[str] = []
    previous = getattr(_capture, "errors", None)
    set_llama_verbose(bool(_state["verbose"]))
    _capture.errors = found
    try:
        yield found
    finally:
        _capture.errors = previous


@contextlib.contextmanager
def _capturing(kind: str) -> Iterator[dict[str, int]]:
    found: dict[str, int] = {}
    previous = getattr(_capture, kind, None)
    set_llama_verbose(bool(_state["verbose"]))  # ours, even if something else replaced it
    setattr(_capture, kind, found)
    try:
        yield found
    finally:
        setattr(_capture, kind, previous)


# llama.cpp calls the C filter (bmoe.cext.log_filter), which drops the debug line each weight
# repack logs (streaming repacks every expert it reads, on the read lanes) and passes every
# other line to _log_callback
_filter = llama_cpp.llama_log_callback(log_filter.callback_address())
_forward = ctypes.c_void_p(ctypes.cast(_log_callback, ctypes.c_void_p).value)


def set_llama_verbose(verbose: bool) -> None:
    """Show all of llama.cpp's log (True) or only its errors (False, the default). The
    debug line llama.cpp logs for each weight it repacks is never shown."""
    _state["verbose"] = int(verbose)
    llama_cpp.llama_log_set(_filter, _forward)
    if _mtmd_log_set is not None:  # the vision encoder (clip, mtmd) logs through its own hook
        _mtmd_log_set(_filter, _forward)


_mtmd_log_set: Callable[[object, ctypes.c_void_p], None] | None = None


def route_mtmd_log(log_set: Callable[[object, ctypes.c_void_p], None]) -> None:
    """Route the vision encoder's log (mtmd's ``mtmd_log_set``: mtmd and clip log through
    their own hook) as llama.cpp's, now and at every later ``set_llama_verbose``; called
    when libmtmd is first loaded (``bmoe.adapters.llama.vision``)."""
    global _mtmd_log_set
    _mtmd_log_set = log_set
    set_llama_verbose(bool(_state["verbose"]))


_backend_ready = False


def ensure_backend() -> None:
    """Initialise llama.cpp's backends once per process, with bmoe's log routing."""
    global _backend_ready
    if not _backend_ready:
        set_llama_verbose(bool(_state["verbose"]))
        llama_cpp.llama_backend_init()
        _backend_ready = True
