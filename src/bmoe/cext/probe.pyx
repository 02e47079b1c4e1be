# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The decide probe's eval callback: observe a prefill's hidden states and routing, chained.

``DecideProbe`` owns a C eval callback (``ggml_backend_sched_eval_callback``) that wraps
another one, the *inner* callback (the expert streamer's, a ``RouteRecorder``, or none).
Every ``ask`` and every ``observe`` call goes to the inner callback exactly as if the probe
were not there: the probe answers ``ask`` with the inner answer OR its own, and forwards an
``observe`` to the inner callback only for a node the inner callback asked for (the
scheduler observes the last node asked, right after asking for it). The inner callback runs
first, so the probe reads what the graph goes on to use.

While *armed* (``armed = True``, between decodes), the probe also asks for:

- ``l_out-L``: the state at the end of layer L. It keeps the last row (the last token of
  the ubatch); after a prefill, the last token's state after each layer.
- ``ffn_moe_topk-L``: the selected expert ids ``[n_tokens, k]`` (a view of an argsort: read
  with the tensor's strides).
- ``ffn_moe_weights-L``, ``ffn_moe_weights_softmax-L``, ``ffn_moe_weights_norm-L``: the
  weights of those ids, each stage replacing the one before (llama.cpp's ``build_moe_ffn``
  builds them in this order, the normalised one last; the constant ``ffn_moe_weights_scaled``
  is not read), so the weights kept are the router's after normalisation.

A layer's routing (ids, then weights) is added to the per-layer, per-expert counters
``cnt`` (routings) and ``wsum`` (summed weight) when the next ``ffn_moe_topk`` or
``l_out`` node comes, or when Python reads them. Unarmed, the probe only forwards: the
nodes the graph computes, and what it computes, are the inner callback's business alone.

The callback runs on llama.cpp's thread without the GIL; it never allocates and never calls
into Python. A routing wider than the buffers (``max_routings``) is skipped and sets
``overflowed``. Only host-memory tensors are read (the CPU backend).
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset, strncmp

import numpy as np

from bmoe.cext.graph_names cimport TOPK_PREFIX_LEN, parse_layer
from bmoe.cext.ggml cimport GGML_TYPE_F32, GGML_TYPE_I32, bool, ggml_tensor


ctypedef bool (*eval_callback_t)(ggml_tensor * t, bool ask, void * user_data) noexcept nogil

cdef enum:
    LOUT_PREFIX_LEN = 6              # len("l_out-")
    WEIGHTS_PREFIX_LEN = 16          # len("ffn_moe_weights-")
    WEIGHTS_SOFTMAX_PREFIX_LEN = 24  # len("ffn_moe_weights_softmax-")
    WEIGHTS_NORM_PREFIX_LEN = 21     # len("ffn_moe_weights_norm-")

cdef enum node_kind:
    NODE_OTHER
    NODE_TOPK
    NODE_WEIGHTS
    NODE_STATE


cdef struct probe_t:
    eval_callback_t inner
    void * inner_data
    int armed
    bool inner_asked        # the inner callback's answer to the last ask
    int32_t n_layer
    int32_t n_embd
    int32_t n_expert
    float * hidden          # [n_layer, n_embd]: the last row of l_out-L
    uint8_t * seen          # [n_layer]: 1 once l_out-L had a row
    int64_t * cnt           # [n_layer, n_expert]
    double * wsum           # [n_layer, n_expert]
    int64_t cap             # routings (token, slot) one ubatch's layer may hold
    int32_t * ids           # [n_tokens, k] of the pending layer
    float * weights         # [n_tokens, k] of the pending layer
    int32_t pending_layer   # -1: nothing pending
    int64_t pending_tokens
    int64_t pending_k
    int pending_has_weights
    int32_t nu              # k of the last ffn_moe_topk node
    int overflowed
    int64_t n_topk_seen
    int64_t n_weights_seen
    int64_t n_states_seen


cdef inline node_kind classify(const char * name, int * layer) noexcept nogil:
    if strncmp(name, b"l_out-", LOUT_PREFIX_LEN) == 0:
        layer[0] = parse_layer(name, LOUT_PREFIX_LEN)
        return NODE_STATE if layer[0] >= 0 else NODE_OTHER
    if strncmp(name, b"ffn_moe_", 8) != 0:
        return NODE_OTHER
    if strncmp(name, b"ffn_moe_topk-", TOPK_PREFIX_LEN) == 0:
        layer[0] = parse_layer(name, TOPK_PREFIX_LEN)
        return NODE_TOPK if layer[0] >= 0 else NODE_OTHER
    if strncmp(name, b"ffn_moe_weights-", WEIGHTS_PREFIX_LEN) == 0:
        layer[0] = parse_layer(name, WEIGHTS_PREFIX_LEN)
    elif strncmp(name, b"ffn_moe_weights_softmax-", WEIGHTS_SOFTMAX_PREFIX_LEN) == 0:
        layer[0] = parse_layer(name, WEIGHTS_SOFTMAX_PREFIX_LEN)
    elif strncmp(name, b"ffn_moe_weights_norm-", WEIGHTS_NORM_PREFIX_LEN) == 0:
        layer[0] = parse_layer(name, WEIGHTS_NORM_PREFIX_LEN)
    else:
        return NODE_OTHER
    return NODE_WEIGHTS if layer[0] >= 0 else NODE_OTHER


cdef void commit(probe_t * p) noexcept nogil:
    """Add the pending layer's routing to the counters."""
    cdef int64_t i, e
    cdef int64_t base
    cdef int64_t n = p.pending_tokens * p.pending_k
    if p.pending_layer < 0:
        return
    if p.pending_layer < p.n_layer:
        base = <int64_t> p.pending_layer * p.n_expert
        for i in range(n):
            e = p.ids[i]
            if 0 <= e < p.n_expert:
                p.cnt[base + e] += 1
                if p.pending_has_weights:
                    p.wsum[base + e] += p.weights[i]
    p.pending_layer = -1


cdef void observe_topk(probe_t * p, ggml_tensor * t, int layer) noexcept nogil:
    cdef int64_t k = t.ne[0]
    cdef int64_t n_tokens = t.ne[1]
    cdef int64_t i, j
    cdef char * base = <char *> t.data
    commit(p)
    p.n_topk_seen += 1
    if t.type != GGML_TYPE_I32 or t.data == NULL or t.ne[2] != 1 or t.ne[3] != 1:
        return
    if k * n_tokens > p.cap:
        p.overflowed = 1
        return
    for j in range(n_tokens):
        for i in range(k):
            p.ids[j * k + i] = (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]
    p.pending_layer = layer
    p.pending_tokens = n_tokens
    p.pending_k = k
    p.pending_has_weights = 0
    p.nu = <int32_t> k


cdef void observe_weights(probe_t * p, ggml_tensor * t, int layer) noexcept nogil:
    cdef int64_t k = p.pending_k
    cdef int64_t n_tokens = p.pending_tokens
    cdef int64_t i, j
    cdef size_t slot_stride, token_stride
    cdef char * base = <char *> t.data
    p.n_weights_seen += 1
    if layer != p.pending_layer or t.type != GGML_TYPE_F32 or t.data == NULL:
        return
    if t.ne[0] == k and t.ne[1] == n_tokens and t.ne[2] == 1 and t.ne[3] == 1:
        slot_stride = t.nb[0]           # [k, n_tokens] (ffn_moe_weights_norm)
        token_stride = t.nb[1]
    elif t.ne[0] == 1 and t.ne[1] == k and t.ne[2] == n_tokens and t.ne[3] == 1:
        slot_stride = t.nb[1]           # [1, k, n_tokens] (ffn_moe_weights, _softmax)
        token_stride = t.nb[2]
    else:
        return
    for j in range(n_tokens):
        for i in range(k):
            p.weights[j * k + i] = (<float *> (base + i * slot_stride + j * token_stride))[0]
    p.pending_has_weights = 1


cdef void observe_state(probe_t * p, ggml_tensor * t, int layer) noexcept nogil:
    cdef int64_t i
    cdef char * last
    commit(p)
    p.n_states_seen += 1
    if layer >= p.n_layer or t.type != GGML_TYPE_F32 or t.data == NULL or t.ne[0] != p.n_embd:
        return
    if t.ne[1] < 1 or t.ne[2] < 1 or t.ne[3] < 1:
        return  # no row: a last layer cut to the outputs of a ubatch that has none
    last = (<char *> t.data) + (t.ne[1] - 1) * t.nb[1] + (t.ne[2] - 1) * t.nb[2] + (t.ne[3] - 1) * t.nb[3]
    for i in range(p.n_embd):
        p.hidden[<int64_t> layer * p.n_embd + i] = (<float *> (last + i * t.nb[0]))[0]
    p.seen[layer] = 1


cdef bool probe_callback(ggml_tensor * t, bool ask, void * user_data) noexcept nogil:
    cdef probe_t * p = <probe_t *> user_data
    cdef int layer = -1
    cdef node_kind kind = NODE_OTHER
    cdef bool inner_answer = ask == 0  # what no callback at all answers
    if p.armed:
        kind = classify(t.name, &layer)
    if ask:
        if p.inner != NULL:
            inner_answer = p.inner(t, ask, p.inner_data)
        p.inner_asked = inner_answer
        return inner_answer or kind != NODE_OTHER
    if p.inner != NULL and p.inner_asked:
        inner_answer = p.inner(t, ask, p.inner_data)
    if kind == NODE_TOPK:
        observe_topk(p, t, layer)
    elif kind == NODE_WEIGHTS:
        observe_weights(p, t, layer)
    elif kind == NODE_STATE:
        observe_state(p, t, layer)
    return inner_answer


cdef class DecideProbe:
    """Owns the probe's C state; keep it alive as long as a context uses it.

    ``inner``: an object with ``callback_address`` / ``user_data_address`` (the callback the
    context would have had without the probe), or None. The probe keeps a reference to it.
    """

    cdef probe_t * p
    cdef object _inner

    def __cinit__(self, *, int n_layer, int n_embd, int n_expert, int64_t max_routings, inner=None):
        if n_layer < 1 or n_embd < 1 or n_expert < 0 or max_routings < 1:
            raise ValueError("n_layer, n_embd and max_routings must be positive, n_expert >= 0")
        self.p = <probe_t *> calloc(1, sizeof(probe_t))
        if self.p == NULL:
            raise MemoryError()
        self.p.n_layer = n_layer
        self.p.n_embd = n_embd
        self.p.n_expert = n_expert
        self.p.cap = max_routings
        self.p.pending_layer = -1
        self.p.hidden = <float *> calloc(<int64_t> n_layer * n_embd, sizeof(float))
        self.p.seen = <uint8_t *> calloc(n_layer, 1)
        self.p.cnt = <int64_t *> calloc(max(1, <int64_t> n_layer * n_expert), sizeof(int64_t))
        self.p.wsum = <double *> calloc(max(1, <int64_t> n_layer * n_expert), sizeof(double))
        self.p.ids = <int32_t *> calloc(max_routings, sizeof(int32_t))
        self.p.weights = <float *> calloc(max_routings, sizeof(float))
        if (self.p.hidden == NULL or self.p.seen == NULL or self.p.cnt == NULL or self.p.wsum == NULL
                or self.p.ids == NULL or self.p.weights == NULL):
            raise MemoryError()
        self._inner = inner
        if inner is not None:
            self.p.inner = <eval_callback_t> (<uintptr_t> inner.callback_address)
            self.p.inner_data = <void *> (<uintptr_t> inner.user_data_address)

    def __dealloc__(self):
        if self.p != NULL:
            free(self.p.hidden)
            free(self.p.seen)
            free(self.p.cnt)
            free(self.p.wsum)
            free(self.p.ids)
            free(self.p.weights)
            free(self.p)
            self.p = NULL

    @property
    def callback_address(self) -> int:
        """Address of the C function ``bool cb(struct ggml_tensor *, bool ask, void *)``."""
        return <uintptr_t> &probe_callback

    @property
    def user_data_address(self) -> int:
        """The ``cb_eval_user_data`` pointer that goes with ``callback_address``."""
        return <uintptr_t> self.p

    @property
    def inner(self):
        """The wrapped callback object (None: the probe is the only callback)."""
        return self._inner

    @property
    def armed(self) -> bool:
        """Whether the probe asks for and reads its nodes (set between decodes only)."""
        return self.p.armed != 0

    @armed.setter
    def armed(self, bint on):
        self.p.armed = 1 if on else 0

    def reset(self):
        """Forget every state and count (between decodes only)."""
        cdef int64_t n_cells = <int64_t> self.p.n_layer * self.p.n_expert
        memset(self.p.hidden, 0, <int64_t> self.p.n_layer * self.p.n_embd * sizeof(float))
        memset(self.p.seen, 0, self.p.n_layer)
        memset(self.p.cnt, 0, n_cells * sizeof(int64_t))
        memset(self.p.wsum, 0, n_cells * sizeof(double))
        self.p.pending_layer = -1
        self.p.nu = 0
        self.p.overflowed = 0
        self.p.n_topk_seen = 0
        self.p.n_weights_seen = 0
        self.p.n_states_seen = 0

    @property
    def overflowed(self) -> bool:
        """True once a routing did not fit ``max_routings`` (it was not counted)."""
        return self.p.overflowed != 0

    @property
    def n_topk_seen(self) -> int:
        return self.p.n_topk_seen

    @property
    def n_weights_seen(self) -> int:
        return self.p.n_weights_seen

    @property
    def n_states_seen(self) -> int:
        return self.p.n_states_seen

    def states(self):
        """``(hidden, seen)``: float32 ``[n_layer, n_embd]``, the last row of each ``l_out-L``
        observed since ``reset()``, and bool ``[n_layer]``, which layers had one."""
        hidden = np.empty((self.p.n_layer, self.p.n_embd), dtype=np.float32)
        seen = np.empty(self.p.n_layer, dtype=np.bool_)
        cdef float[:, ::1] hv = hidden
        cdef int32_t layer
        memcpy(&hv[0, 0], self.p.hidden, <int64_t> self.p.n_layer * self.p.n_embd * sizeof(float))
        for layer in range(self.p.n_layer):
            seen[layer] = self.p.seen[layer] != 0
        return hidden, seen

    def routing(self):
        """``(cnt, wsum, nu)``: int64 and float64 ``[n_layer, n_expert]`` (routings and summed
        router weight per layer and expert since ``reset()``) and the ``k`` of the last
        routing seen (0: none). Counts the pending layer first (between decodes only)."""
        commit(self.p)
        cdef int64_t n_cells = <int64_t> self.p.n_layer * self.p.n_expert
        cnt = np.zeros((self.p.n_layer, self.p.n_expert), dtype=np.int64)
        wsum = np.zeros((self.p.n_layer, self.p.n_expert), dtype=np.float64)
        cdef int64_t[:, ::1] cv
        cdef double[:, ::1] wv
        if n_cells > 0:
            cv = cnt
            wv = wsum
            memcpy(&cv[0, 0], self.p.cnt, n_cells * sizeof(int64_t))
            memcpy(&wv[0, 0], self.p.wsum, n_cells * sizeof(double))
        return cnt, wsum, self.p.nu
