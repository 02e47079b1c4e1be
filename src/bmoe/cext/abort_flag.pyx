# cython: language_level=3
"""A cancel flag that llama.cpp polls through its abort callback, without the GIL.

llama.cpp calls the abort callback (``llama_set_abort_callback``, ``ggml_abort_callback``)
from its compute threads, once per graph node on the CPU backend: a Python callback there
would take the GIL thousands of times per token. ``AbortFlag`` is a C function reading one
C int; ``set()`` may be called from any thread. When it returns true, ``llama_decode``
stops and returns 2 (``DecodeAbortedError``).
"""

from libc.stdint cimport uintptr_t
from libc.stdlib cimport calloc, free

from bmoe.cext.ggml cimport bool


cdef bool abort_callback(void * data) noexcept nogil:
    return (<volatile int *> data)[0] != 0


cdef class AbortFlag:
    """Owns the flag; keep it alive as long as a context polls it."""

    cdef int * flag

    def __cinit__(self):
        self.flag = <int *> calloc(1, sizeof(int))
        if self.flag == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.flag)
        self.flag = NULL

    def set(self):
        """Ask the running decode (and every later one, until ``clear()``) to stop."""
        (<volatile int *> self.flag)[0] = 1

    def clear(self):
        (<volatile int *> self.flag)[0] = 0

    @property
    def is_set(self) -> bool:
        return (<volatile int *> self.flag)[0] != 0

    @property
    def callback_address(self) -> int:
        """Address of the C function ``bool abort(void * data)``."""
        return <uintptr_t> &abort_callback

    @property
    def user_data_address(self) -> int:
        return <uintptr_t> self.flag
