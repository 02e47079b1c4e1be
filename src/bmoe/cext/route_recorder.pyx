# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Record which experts each MoE layer selected, from inside llama.cpp's graph compute.

``RouteRecorder`` owns a C eval callback (``ggml_backend_sched_eval_callback``) and its
state. Handed to a llama context (``cb_eval`` / ``cb_eval_user_data``), the callback asks the
scheduler to stop after every ``ffn_moe_topk-L`` node (and, optionally, ``ffn_moe_probs-L``),
then gathers the selected expert ids with the tensor's own strides (``ffn_moe_topk`` is a view
of an argsort, so rows are not contiguous in general) into a log that Python reads back after
the decode. It can also overwrite the ids in place (``force_expert``), which changes which
experts the rest of the layer uses: that is how the tests prove the ids it reads are the ids
the graph uses, and the hook that route-ahead and streaming build on.

The callback runs on llama.cpp's thread, without the GIL, once per graph node that it asks
for; it never allocates and never calls into Python. The log has a fixed capacity; when it is
full, recording stops and ``overflowed`` turns true (the decode itself is never disturbed).
Only host-memory tensors are supported (the CPU backend).
"""

from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, strncmp

import numpy as np

from bmoe.cext.graph_names cimport PROBS_PREFIX_LEN, TOPK_PREFIX_LEN, parse_layer
from bmoe.cext.ggml cimport (
    GGML_TYPE_F32,
    GGML_TYPE_I32,
    bool,
    ggml_tensor,
)



cdef struct record_t:
    int32_t layer
    int32_t n_tokens
    int32_t k            # ids per token (n_expert_used)
    int64_t ids_off      # into ids log
    int32_t n_expert     # 0 when no probs row was captured for this record
    int64_t probs_off    # into probs log


cdef struct recorder_t:
    record_t * records
    int64_t cap_records
    int64_t n_records
    int32_t * ids
    int64_t cap_ids
    int64_t n_ids
    float * probs
    int64_t cap_probs
    int64_t n_probs
    int capture_probs
    int32_t force_expert     # -1: leave the ids alone
    int overflowed
    int64_t n_topk_seen
    # probs of the current layer, waiting for its topk node
    int32_t pending_layer
    int32_t pending_n_expert
    int64_t pending_probs_off




cdef inline void capture_probs(recorder_t * rec, ggml_tensor * t, int layer) noexcept nogil:
    cdef int64_t n_expert = t.ne[0]
    cdef int64_t n_tokens = t.ne[1]
    cdef int64_t i, j
    cdef char * base = <char *> t.data
    rec.pending_layer = -1
    if t.type != GGML_TYPE_F32 or t.data == NULL:
        return
    if rec.n_probs + n_expert * n_tokens > rec.cap_probs:
        rec.overflowed = 1
        return
    for j in range(n_tokens):
        for i in range(n_expert):
            rec.probs[rec.n_probs + j * n_expert + i] = (<float *> (base + i * t.nb[0] + j * t.nb[1]))[0]
    rec.pending_layer = layer
    rec.pending_n_expert = <int32_t> n_expert
    rec.pending_probs_off = rec.n_probs
    rec.n_probs += n_expert * n_tokens


cdef inline void capture_topk(recorder_t * rec, ggml_tensor * t, int layer) noexcept nogil:
    cdef int64_t k = t.ne[0]
    cdef int64_t n_tokens = t.ne[1]
    cdef int64_t i, j
    cdef char * base = <char *> t.data
    cdef int32_t * slot
    cdef record_t * r
    rec.n_topk_seen += 1
    if t.type != GGML_TYPE_I32 or t.data == NULL:
        return
    if rec.n_records < rec.cap_records and rec.n_ids + k * n_tokens <= rec.cap_ids:
        r = &rec.records[rec.n_records]
        r.layer = layer
        r.n_tokens = <int32_t> n_tokens
        r.k = <int32_t> k
        r.ids_off = rec.n_ids
        r.n_expert = 0
        r.probs_off = 0
        if rec.pending_layer == layer:
            r.n_expert = rec.pending_n_expert
            r.probs_off = rec.pending_probs_off
        for j in range(n_tokens):
            for i in range(k):
                rec.ids[rec.n_ids + j * k + i] = (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]
        rec.n_ids += k * n_tokens
        rec.n_records += 1
    else:
        rec.overflowed = 1
    rec.pending_layer = -1
    if rec.force_expert >= 0:
        for j in range(n_tokens):
            for i in range(k):
                slot = <int32_t *> (base + i * t.nb[0] + j * t.nb[1])
                slot[0] = rec.force_expert


cdef bool eval_callback(ggml_tensor * t, bool ask, void * user_data) noexcept nogil:
    cdef recorder_t * rec = <recorder_t *> user_data
    cdef const char * name = t.name
    cdef int layer
    if strncmp(name, b"ffn_moe_topk-", TOPK_PREFIX_LEN) == 0:
        layer = parse_layer(name, TOPK_PREFIX_LEN)
        if layer < 0:
            return ask == 0
        if ask:
            return 1
        capture_topk(rec, t, layer)
        return 1
    if rec.capture_probs and strncmp(name, b"ffn_moe_probs-", PROBS_PREFIX_LEN) == 0:
        layer = parse_layer(name, PROBS_PREFIX_LEN)
        if layer < 0:
            return ask == 0
        if ask:
            return 1
        capture_probs(rec, t, layer)
        return 1
    # Not ours: do not stop the scheduler here (ask), and keep going (not ask).
    return ask == 0


cdef class RouteRecorder:
    """Owns the C state of the eval callback; keep it alive as long as a context uses it."""

    cdef recorder_t * rec

    def __cinit__(self, *, int max_records=65536, int64_t max_ids=1 << 22,
                  bint capture_probs=False, int64_t max_probs=1 << 22):
        self.rec = <recorder_t *> calloc(1, sizeof(recorder_t))
        if self.rec == NULL:
            raise MemoryError()
        self.rec.records = <record_t *> calloc(max_records, sizeof(record_t))
        self.rec.ids = <int32_t *> calloc(max_ids, sizeof(int32_t))
        self.rec.probs = <float *> calloc(max_probs if capture_probs else 1, sizeof(float))
        if self.rec.records == NULL or self.rec.ids == NULL or self.rec.probs == NULL:
            raise MemoryError()
        self.rec.cap_records = max_records
        self.rec.cap_ids = max_ids
        self.rec.cap_probs = max_probs if capture_probs else 0
        self.rec.capture_probs = 1 if capture_probs else 0
        self.rec.force_expert = -1
        self.rec.pending_layer = -1

    def __dealloc__(self):
        if self.rec != NULL:
            free(self.rec.records)
            free(self.rec.ids)
            free(self.rec.probs)
            free(self.rec)
            self.rec = NULL

    @property
    def callback_address(self) -> int:
        """Address of the C function ``bool cb(struct ggml_tensor *, bool ask, void *)``."""
        return <uintptr_t> &eval_callback

    @property
    def user_data_address(self) -> int:
        """The ``cb_eval_user_data`` pointer that goes with ``callback_address``."""
        return <uintptr_t> self.rec

    @property
    def force_expert(self) -> int:
        """Expert id written over every selected id after recording; -1 leaves them alone."""
        return self.rec.force_expert

    @force_expert.setter
    def force_expert(self, int value):
        if value < -1:
            raise ValueError(f"force_expert must be -1 or an expert id, not {value}")
        self.rec.force_expert = value

    @property
    def overflowed(self) -> bool:
        """True once a record did not fit in the log (recording stopped there)."""
        return self.rec.overflowed != 0

    @property
    def n_topk_seen(self) -> int:
        """How many ``ffn_moe_topk-L`` nodes the callback saw since the last ``clear()``."""
        return self.rec.n_topk_seen

    def __len__(self):
        return self.rec.n_records

    def clear(self):
        """Forget every record (call between decodes, never during one)."""
        self.rec.n_records = 0
        self.rec.n_ids = 0
        self.rec.n_probs = 0
        self.rec.overflowed = 0
        self.rec.n_topk_seen = 0
        self.rec.pending_layer = -1

    def records(self):
        """The log, oldest first: a list of ``(layer, ids, probs)``.

        ``ids`` is an int32 array ``[n_tokens, n_expert_used]`` in the graph's slot order;
        ``probs`` the float32 router probabilities ``[n_tokens, n_expert]`` of the same layer
        and ubatch when ``capture_probs`` was set, else ``None``.
        """
        cdef int64_t n
        cdef record_t * r
        cdef int32_t[:, ::1] ids_view
        cdef float[:, ::1] probs_view
        out = []
        for n in range(self.rec.n_records):
            r = &self.rec.records[n]
            ids = np.empty((r.n_tokens, r.k), dtype=np.int32)
            if r.n_tokens * r.k > 0:
                ids_view = ids
                memcpy(&ids_view[0, 0], self.rec.ids + r.ids_off, r.n_tokens * r.k * sizeof(int32_t))
            probs = None
            if r.n_expert > 0:
                probs = np.empty((r.n_tokens, r.n_expert), dtype=np.float32)
                probs_view = probs
                memcpy(&probs_view[0, 0], self.rec.probs + r.probs_off,
                       r.n_tokens * r.n_expert * sizeof(float))
            out.append((r.layer, ids, probs))
        return out
