# cython: language_level=3
"""A C log callback in front of bmoe's Python one: the lines it must never take the GIL for.

llama.cpp's repack logs one debug line per tensor it repacks (``repack: repack tensor ...``).
bmoe repacks each routed expert as a read lane writes it, thousands of times a second,
on threads that must never wait for the GIL (the eval thread waits for the lanes while
Python may hold it). This callback drops those lines in C and hands every other line to
the callback whose address it was installed with (its ``user_data``).
"""

from libc.stdint cimport uintptr_t
from libc.string cimport strncmp

ctypedef void (*log_callback_t)(int, const char *, void *) noexcept nogil

cdef enum:
    GGML_LOG_LEVEL_DEBUG = 1

cdef const char * REPACK_LINE = b"repack: repack tensor "
cdef int REPACK_LINE_LEN = 22


cdef void filter_log(int level, const char * text, void * user_data) noexcept nogil:
    if level == GGML_LOG_LEVEL_DEBUG and strncmp(text, REPACK_LINE, REPACK_LINE_LEN) == 0:
        return
    if user_data != NULL:
        (<log_callback_t> user_data)(level, text, NULL)


def callback_address() -> int:
    """The filter's address, for ``llama_log_set`` (its ``user_data``: the callback it feeds)."""
    return <uintptr_t> filter_log


def dropped(int level, bytes text) -> bool:
    """Whether the filter drops this line (for the tests)."""
    return level == GGML_LOG_LEVEL_DEBUG and strncmp(text, REPACK_LINE, REPACK_LINE_LEN) == 0
