# cython: language_level=3, boundscheck=False, wraparound=False
"""Weights in llama.cpp's repacked layout (its ``CPU_REPACK`` buffer type), through its API.

llama.cpp's CPU backend computes a matmul with its repacked kernels when the weight's
buffer is of the ``CPU_REPACK`` type and the weight's ``extra`` holds the repack traits that
buffer type's ``init_tensor`` chose for it; the bytes are the file's, rearranged by that
buffer type's ``set_tensor``. Stock llama.cpp does this at load for every weight it can
(``use_extra_bufts``), copying the whole model. bmoe loads with repacking off (the streamer
needs the expert tensors where it reads them) and then, with the calls below:

- ``supported``: would llama.cpp repack this weight? The test its loader makes: the op the
  weight feeds, on a stand-in tensor in a buffer of the type, asked of the CPU device;
- ``move_to_buffer``: dense weights move into one buffer of an extra type (``CPU_REPACK``,
  or ``AMX`` where llama.cpp's loader would put them there)
  (``ggml_backend_tensor_alloc``, then ``ggml_backend_tensor_set`` from their bytes: what the
  loader does);
- ``tag``: a routed-expert tensor keeps the streamer's memory and gets a ``CPU_REPACK``
  buffer and its traits; ``Templates`` holds, per projection, a tensor of one expert's shape
  with the same traits, which the read lanes copy, point at a slice and hand to
  ``ggml_backend_tensor_set``: each expert lands repacked as it is read.

Nothing of llama.cpp's layouts is known here; every function is llama.cpp's, resolved from
the library llama-cpp-python loaded (``bind``). The gates compare with llama.cpp's own
load-time repack, bit for bit.
"""

from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memset

from bmoe.cext.ggml cimport GGML_OP_MUL_MAT, GGML_OP_MUL_MAT_ID, GGML_TYPE_F32, GGML_TYPE_I32, bool
from bmoe.cext.ggml cimport ggml_init_params, ggml_tensor

cdef extern from "ggml-backend.h" nogil:
    enum:
        GGML_BACKEND_BUFFER_USAGE_WEIGHTS

ctypedef void * (*init_f)(ggml_init_params) noexcept nogil
ctypedef void (*free_f)(void *) noexcept nogil
ctypedef size_t (*tensor_overhead_f)() noexcept nogil
ctypedef ggml_tensor * (*new_tensor_f)(void *, int, int, const int64_t *) noexcept nogil
ctypedef ggml_tensor * (*mul_mat_f)(void *, ggml_tensor *, ggml_tensor *) noexcept nogil
ctypedef ggml_tensor * (*mul_mat_id_f)(void *, ggml_tensor *, ggml_tensor *, ggml_tensor *) noexcept nogil
ctypedef size_t (*nbytes_f)(const ggml_tensor *) noexcept nogil
ctypedef void * (*buft_alloc_buffer_f)(void *, size_t) noexcept nogil
ctypedef size_t (*buft_get_alignment_f)(void *) noexcept nogil
ctypedef void (*buffer_free_f)(void *) noexcept nogil
ctypedef void * (*buffer_get_base_f)(void *) noexcept nogil
ctypedef void (*buffer_set_usage_f)(void *, int) noexcept nogil
ctypedef int (*buffer_init_tensor_f)(void *, ggml_tensor *) noexcept nogil
ctypedef int (*tensor_alloc_f)(void *, ggml_tensor *, void *) noexcept nogil
ctypedef void (*tensor_set_f)(ggml_tensor *, const void *, size_t, size_t) noexcept nogil
ctypedef bool (*dev_supports_op_f)(void *, const ggml_tensor *) noexcept nogil
ctypedef size_t (*buft_get_alloc_size_f)(void *, const ggml_tensor *) noexcept nogil

cdef struct api_t:
    init_f init
    free_f free
    tensor_overhead_f tensor_overhead
    new_tensor_f new_tensor
    mul_mat_f mul_mat
    mul_mat_id_f mul_mat_id
    nbytes_f nbytes
    buft_alloc_buffer_f buft_alloc_buffer
    buft_get_alignment_f buft_get_alignment
    buffer_free_f buffer_free
    buffer_get_base_f buffer_get_base
    buffer_set_usage_f buffer_set_usage
    buffer_init_tensor_f buffer_init_tensor
    tensor_alloc_f tensor_alloc
    tensor_set_f tensor_set
    dev_supports_op_f dev_supports_op
    buft_get_alloc_size_f buft_get_alloc_size

cdef api_t api
cdef bint bound = False

FUNCTIONS = (
    "ggml_init",
    "ggml_free",
    "ggml_tensor_overhead",
    "ggml_new_tensor",
    "ggml_mul_mat",
    "ggml_mul_mat_id",
    "ggml_nbytes",
    "ggml_backend_buft_alloc_buffer",
    "ggml_backend_buft_get_alignment",
    "ggml_backend_buffer_free",
    "ggml_backend_buffer_get_base",
    "ggml_backend_buffer_set_usage",
    "ggml_backend_buffer_init_tensor",
    "ggml_backend_tensor_alloc",
    "ggml_backend_tensor_set",
    "ggml_backend_dev_supports_op",
    "ggml_backend_buft_get_alloc_size",
)
"""The ggml functions this module calls, by name: ``bind`` takes their addresses."""

OP_MUL_MAT = 1
OP_MUL_MAT_ID = 2


def bind(addresses):
    """Take the addresses of ``FUNCTIONS`` (a mapping name -> address, from the loaded
    library); ``KeyError`` naming the first one missing."""
    global bound
    cdef uintptr_t a[17]
    for i, name in enumerate(FUNCTIONS):
        value = addresses[name]
        if not value:
            raise KeyError(name)
        a[i] = <uintptr_t> value
    api.init = <init_f> a[0]
    api.free = <free_f> a[1]
    api.tensor_overhead = <tensor_overhead_f> a[2]
    api.new_tensor = <new_tensor_f> a[3]
    api.mul_mat = <mul_mat_f> a[4]
    api.mul_mat_id = <mul_mat_id_f> a[5]
    api.nbytes = <nbytes_f> a[6]
    api.buft_alloc_buffer = <buft_alloc_buffer_f> a[7]
    api.buft_get_alignment = <buft_get_alignment_f> a[8]
    api.buffer_free = <buffer_free_f> a[9]
    api.buffer_get_base = <buffer_get_base_f> a[10]
    api.buffer_set_usage = <buffer_set_usage_f> a[11]
    api.buffer_init_tensor = <buffer_init_tensor_f> a[12]
    api.tensor_alloc = <tensor_alloc_f> a[13]
    api.tensor_set = <tensor_set_f> a[14]
    api.dev_supports_op = <dev_supports_op_f> a[15]
    api.buft_get_alloc_size = <buft_get_alloc_size_f> a[16]
    bound = True


cdef inline void need_api() except *:
    if not bound:
        raise RuntimeError("weight_repack.bind() was not called")


def tensor_set_address() -> int:
    """The address of ``ggml_backend_tensor_set`` (the read lanes call it, without the GIL)."""
    need_api()
    return <uintptr_t> api.tensor_set


def tensor_info(uintptr_t address):
    """What bmoe reads of a weight: its type, shape, strides, memory, buffer and ``extra``."""
    cdef ggml_tensor * t = <ggml_tensor *> address
    return {
        "name": t.name.decode("utf-8", "replace"),
        "type": <int> t.type,
        "ne": tuple(t.ne[i] for i in range(4)),
        "nb": tuple(t.nb[i] for i in range(4)),
        "data": <uintptr_t> t.data,
        "buffer": <uintptr_t> t.buffer,
        "extra": <uintptr_t> t.extra,
        "view_src": <uintptr_t> t.view_src,
    }


def alloc_buffer(uintptr_t buft, size_t size) -> int:
    """A buffer of type ``buft`` holding weights (``MemoryError`` when llama.cpp cannot)."""
    need_api()
    cdef void * buf = api.buft_alloc_buffer(<void *> buft, size)
    if buf == NULL:
        raise MemoryError(f"llama.cpp could not allocate a {size}-byte weight buffer")
    api.buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    return <uintptr_t> buf


def free_buffer(uintptr_t buffer):
    need_api()
    if buffer:
        api.buffer_free(<void *> buffer)


def supported(uintptr_t tensor, int op, int n_ids, uintptr_t buft, uintptr_t device) -> bool:
    """Whether llama.cpp would put this weight in a buffer of type ``buft``: the op it feeds
    (``OP_MUL_MAT``, or ``OP_MUL_MAT_ID`` with ``n_ids`` experts per token), built on a
    stand-in of its type and shape in a buffer of that type, asked of ``device`` (the test
    llama.cpp's loader makes when it places a weight)."""
    need_api()
    cdef ggml_tensor * w = <ggml_tensor *> tensor
    cdef ggml_init_params params
    params.mem_size = api.tensor_overhead() * 8
    params.mem_buffer = NULL
    params.no_alloc = True
    cdef void * ctx = api.init(params)
    if ctx == NULL:
        raise MemoryError("ggml_init failed")
    cdef int64_t ne[4]
    cdef ggml_tensor * stand_in
    cdef ggml_tensor * b
    cdef ggml_tensor * ids
    cdef ggml_tensor * node
    cdef void * probe = NULL
    cdef bint ok = False
    try:
        stand_in = api.new_tensor(ctx, <int> w.type, 4, w.ne)
        if op == OP_MUL_MAT:
            ne[0] = w.ne[0]; ne[1] = 512; ne[2] = w.ne[2]; ne[3] = w.ne[3]
            b = api.new_tensor(ctx, GGML_TYPE_F32, 4, ne)
            node = api.mul_mat(ctx, stand_in, b)
        elif op == OP_MUL_MAT_ID:
            ne[0] = w.ne[0]; ne[1] = n_ids; ne[2] = 512
            b = api.new_tensor(ctx, GGML_TYPE_F32, 3, ne)
            ne[0] = n_ids; ne[1] = 512
            ids = api.new_tensor(ctx, GGML_TYPE_I32, 2, ne)
            node = api.mul_mat_id(ctx, stand_in, b, ids)
        else:
            raise ValueError(f"unknown op {op}")
        probe = api.buft_alloc_buffer(<void *> buft, 64)
        if probe == NULL:
            raise MemoryError("llama.cpp could not allocate a probe buffer")
        stand_in.buffer = probe
        ok = api.dev_supports_op(<void *> device, node)
    finally:
        if probe != NULL:
            api.buffer_free(probe)
        api.free(ctx)
    return ok


def aligned_size(uintptr_t buft, list tensors) -> int:
    """Bytes of one ``buft`` buffer holding ``tensors`` one after the other, each aligned
    (each takes what the buffer type asks for it: ``AMX`` may ask more than its bytes)."""
    need_api()
    cdef size_t align = api.buft_get_alignment(<void *> buft)
    cdef size_t total = 0
    cdef ggml_tensor * t
    for address in tensors:
        t = <ggml_tensor *> <uintptr_t> address
        total += (api.buft_get_alloc_size(<void *> buft, t) + align - 1) // align * align
    return total


def move_to_buffer(uintptr_t buffer, uintptr_t buft, list tensors, moved=None):
    """Move each tensor into ``buffer`` (sized by ``aligned_size``), one after the other:
    allocated there by llama.cpp and filled from its current bytes with
    ``ggml_backend_tensor_set`` (a ``CPU_REPACK`` buffer repacks them on the way in).
    ``moved(data, nbytes)`` is called after each with the memory it no longer reads (so it
    can be given back at once); returns those pairs too."""
    need_api()
    cdef size_t align = api.buft_get_alignment(<void *> buft)
    cdef char * base = <char *> api.buffer_get_base(<void *> buffer)
    cdef size_t offset = 0, n
    cdef ggml_tensor * t
    cdef void * old
    cdef int status
    out = []
    cdef size_t room
    for address in tensors:
        t = <ggml_tensor *> <uintptr_t> address
        n = api.nbytes(t)
        room = api.buft_get_alloc_size(<void *> buft, t)  # before the move: the type's own size
        old = t.data
        t.buffer = NULL
        t.data = NULL
        status = api.tensor_alloc(<void *> buffer, t, base + offset)
        if status != 0 or t.extra == NULL:
            raise RuntimeError(f"llama.cpp did not take {t.name.decode()} into the buffer (status {status})")
        api.tensor_set(t, old, 0, n)
        out.append((<uintptr_t> old, n))
        if moved is not None:
            moved(<uintptr_t> old, n)
        offset += (room + align - 1) // align * align
    return out


def tag(uintptr_t tensor, uintptr_t buffer) -> bool:
    """Give ``tensor`` the buffer ``buffer`` and the traits its type's ``init_tensor`` picks,
    keeping its memory (the streamer's). False, and the tensor as it was, where the buffer
    type has no traits for it."""
    need_api()
    cdef ggml_tensor * t = <ggml_tensor *> tensor
    cdef void * old_buffer = t.buffer
    cdef void * old_extra = t.extra
    t.buffer = <void *> buffer
    if api.buffer_init_tensor(<void *> buffer, t) != 0 or t.extra == NULL:
        t.buffer = old_buffer
        t.extra = old_extra
        return False
    return True


cdef class Templates:
    """Per expert projection, a tensor of one expert's shape (``ne[0]`` x ``ne[1]``, the
    projection's type) in a ``CPU_REPACK`` buffer, with the traits llama.cpp chose for it.
    The lanes copy one, set its ``data`` to an expert's slice and pass it to
    ``ggml_backend_tensor_set``: the slice is written repacked, exactly as a tensor of that
    shape allocated in the buffer would be. Owns the ggml context the templates live in."""

    cdef void * ctx
    cdef int capacity
    cdef int count

    def __cinit__(self, int capacity):
        need_api()
        cdef ggml_init_params params
        params.mem_size = api.tensor_overhead() * (capacity + 1)
        params.mem_buffer = NULL
        params.no_alloc = True
        self.ctx = api.init(params)
        if self.ctx == NULL:
            raise MemoryError("ggml_init failed")
        self.capacity = capacity
        self.count = 0

    def __dealloc__(self):
        if self.ctx != NULL:
            api.free(self.ctx)
            self.ctx = NULL

    def add(self, uintptr_t tensor, uintptr_t buffer) -> int:
        """A template for one expert of the 3-D ``tensor``; 0 where the buffer type has no
        repacked form for that shape."""
        if self.count >= self.capacity:
            raise ValueError("no room for another template")
        cdef ggml_tensor * w = <ggml_tensor *> tensor
        cdef int64_t ne[2]
        ne[0] = w.ne[0]
        ne[1] = w.ne[1]
        cdef ggml_tensor * t = api.new_tensor(self.ctx, <int> w.type, 2, ne)
        if t == NULL:
            raise MemoryError("ggml_new_tensor failed")
        self.count += 1
        t.buffer = <void *> buffer
        if api.buffer_init_tensor(<void *> buffer, t) != 0 or t.extra == NULL:
            return 0
        if <size_t> api.nbytes(t) != w.nb[2]:
            raise RuntimeError(f"one expert of {w.name.decode()} is not {w.nb[2]} bytes")
        return <uintptr_t> t


def repack_into(uintptr_t template, uintptr_t dest, bytes data):
    """Write ``data`` (one expert's bytes in the file's layout) repacked at ``dest``, as the
    lanes do: for the gates, which compare it with llama.cpp's whole-tensor repack."""
    need_api()
    cdef ggml_tensor scratch
    cdef ggml_tensor * tmpl = <ggml_tensor *> template
    if len(data) != api.nbytes(tmpl):
        raise ValueError(f"{len(data)} bytes, the template holds {api.nbytes(tmpl)}")
    scratch = tmpl[0]
    scratch.data = <void *> dest
    cdef const char * src = data
    api.tensor_set(&scratch, src, 0, len(data))
