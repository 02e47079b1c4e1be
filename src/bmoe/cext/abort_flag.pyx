# cython: language_level=3
"""Cancel and fault flags that llama.cpp polls through its abort callback, without the GIL.

llama.cpp calls the abort callback (``llama_set_abort_callback``, ``ggml_abort_callback``)
from its compute threads, once per graph node on the CPU backend: a Python callback there
would take the GIL thousands of times per token. ``AbortFlag`` is a C function reading two
C ints: *cancel* (``set()``/``clear()``, from any thread, cleared at the end of each
request) and *fault* (raised by the expert streamer through ``fault_address`` when a read
fails, never cleared). When either is set, ``llama_decode`` stops and returns 2
(``DecodeAbortedError``); ``faulted`` tells the two causes apart.
"""

from libc.stdint cimport uintptr_t
from libc.stdlib cimport calloc, free

from bmoe.cext.ggml cimport bool


cdef bool abort_callback(void * data) noexcept nogil:
    cdef volatile int * flags = <volatile int *> data
    return flags[0] != 0 or flags[1] != 0


cdef class AbortFlag:
    """Owns the flags; keep it alive as long as a context polls them."""

    cdef int * flags  # [0]: cancel, [1]: fault

    def __cinit__(self):
        self.flags = <int *> calloc(2, sizeof(int))
        if self.flags == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.flags)
        self.flags = NULL

    def set(self):
        """Ask the running decode (and every later one, until ``clear()``) to stop."""
        (<volatile int *> self.flags)[0] = 1

    def clear(self):
        """Clear the cancel flag (never the fault flag)."""
        (<volatile int *> self.flags)[0] = 0

    @property
    def is_set(self) -> bool:
        return (<volatile int *> self.flags)[0] != 0

    @property
    def faulted(self) -> bool:
        """True once a fault was raised through ``fault_address`` (sticky)."""
        return (<volatile int *> self.flags)[1] != 0

    @property
    def fault_address(self) -> int:
        """Address of the fault int, for the C code that raises it."""
        return <uintptr_t> &self.flags[1]

    @property
    def callback_address(self) -> int:
        """Address of the C function ``bool abort(void * data)``."""
        return <uintptr_t> &abort_callback

    @property
    def user_data_address(self) -> int:
        return <uintptr_t> self.flags
