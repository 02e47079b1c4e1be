# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Expert streaming: the C engine (memory, reads, the eval callback) around the cache core.

``ExpertStreamer`` owns a C eval callback for a llama context. Modes:

- ``MODE_CAPTURE``: during a warm-up decode, the ``ask`` pass records the address of every
  weight (leaf) tensor the graph reads, by name; nothing is computed differently.
- ``MODE_STREAM`` (the fast path): at every ``ffn_moe_topk-L`` node (its data ready, no
  expert of layer L used yet), the callback gathers the selected ids, lets the cache core
  (``cache_core.pxd``, which follows ``bmoe.domain.streaming.ExpertCachePolicy`` decision
  for decision) plan the request, gives back the evicted entries' pages and reads every
  missing expert slice of layer L (``pread`` on N lanes, ``O_DIRECT`` through page-aligned
  bounce buffers) before the nodes that use them compute.
- ``MODE_REFERENCE``: at the same node, the ids go to a Python hook (the domain policy,
  executed through ``bmoe.adapters.expert_source.LaneExpertSource``, which reads with
  ``read_entry`` / ``release_entry`` below). Slow; for proving the fast path equal to it.

Expert memory is llama.cpp's own mapping of the GGUF, overlaid by ``overlay_anonymous``
with anonymous private memory (``MAP_FIXED | MAP_NORESERVE``): pages cost nothing until a
read fills them, eviction gives them back with ``madvise(MADV_DONTNEED)`` (pages wholly
inside the slice only, so bytes of a neighbour are never dropped), and a slice that is not
resident reads as zeros.

Faults are sticky and fatal: a failed or short read, a routing node the streamer cannot
serve (a layer without known experts, an id out of range, ids not I32) or a failing
reference hook records the first fault and sets the context's *fault* flag (an int the
abort callback polls beside the cancel flag, never cleared), so ``llama_decode`` returns 2
instead of computing with a missing expert, now and on every later decode.

The engine is one extension assembled from rooms (``stream/*.pxi``, included below in
dependency order; each opens with what it owns, what it calls and which locks it takes):
``shared`` (states and structs), ``faults``, ``pages`` (page memory), ``lanes`` (the
read lanes and their queue), ``traces``, ``rank_worker``, ``routing`` (the decode routing
policies' mechanism), ``ahead`` (reads ahead of need), ``hook`` (the eval callback) and
``reference`` (the layer call the reference hook serves).
This file is the face: setup, teardown, the Python API and the counters.
"""

from cpython.ref cimport PyObject
from libc.errno cimport EINTR, EIO, errno
from libc.math cimport INFINITY, exp, log1p, sqrt
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uintptr_t
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memcpy, strncmp, strncpy
from posix.fcntl cimport O_RDONLY, open as c_open
from posix.mman cimport (
    MADV_DONTNEED,
    MADV_HUGEPAGE,
    MADV_NOHUGEPAGE,
    MAP_ANONYMOUS,
    MAP_FAILED,
    MAP_FIXED,
    MAP_NORESERVE,
    MAP_PRIVATE,
    PROT_READ,
    PROT_WRITE,
    madvise,
    mmap,
)
from posix.stdlib cimport posix_memalign
from posix.time cimport CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID, clock_gettime, timespec
from posix.unistd cimport close as c_close, pread, usleep

from bmoe.cext.cache_core cimport (
    core_begin,
    core_evict_all,
    core_free,
    core_make_twin,
    core_new,
    core_pass_layer,
    core_plan,
    core_prefetch,
    core_set_budget,
    core_set_rule,
    core_set_victims,
    core_t,
    core_want,
    RULE_LFU,
    RULE_LRU,
    RULE_SLRU,
)
from bmoe.cext.ggml cimport (
    GGML_MAX_SRC,
    GGML_OP_ADD_ID,
    GGML_OP_GET_ROWS,
    GGML_OP_MUL_MAT,
    GGML_OP_MUL_MAT_ID,
    GGML_OP_NONE,
    GGML_TYPE_F32,
    GGML_TYPE_I32,
    bool,
    ggml_tensor,
)
from bmoe.cext.graph_names cimport PROBS_PREFIX_LEN, TOPK_PREFIX_LEN, parse_layer
from bmoe.cext.linux cimport (
    MADV_POPULATE_READ_FLAG,
    MREMAP_DONTUNMAP_FLAG,
    MREMAP_FIXED,
    MREMAP_MAYMOVE,
    O_DIRECT,
    POSIX_FADV_DONTNEED,
    iovec,
    mremap,
    posix_fadvise,
    preadv,
    strerror,
)
from bmoe.cext.pthreads cimport (
    bmoe_claim,
    bmoe_fetch_add,
    bmoe_load,
    bmoe_store,
    pthread_cond_broadcast,
    pthread_cond_destroy,
    pthread_cond_init,
    pthread_cond_signal,
    pthread_cond_t,
    pthread_cond_wait,
    pthread_create,
    pthread_join,
    pthread_mutex_destroy,
    pthread_mutex_init,
    pthread_mutex_lock,
    pthread_mutex_t,
    pthread_mutex_unlock,
    pthread_t,
)
import numpy as np

from bmoe.cext.route_policy cimport (
    rp_agreement,
    rp_drop,
    rp_gate_open,
    rp_rank,
    rp_substitute,
    rp_weights,
    rp_worth_reading,
)

include "stream/shared.pxi"
include "stream/faults.pxi"
include "stream/rows.pxi"
include "stream/pages.pxi"
include "stream/reads.pxi"
include "stream/lanes.pxi"
include "stream/traces.pxi"
include "stream/rank_worker.pxi"
include "stream/routing.pxi"
include "stream/ahead.pxi"
include "stream/hook.pxi"
include "stream/reference.pxi"

def shuffled_rows(int n_layer, int n_expert):
    """A fixed permutation of each layer's rows (``BMOE_EXPERT_ROWS=shuffled``): reversed,
    then turned by the layer's index, so that layers differ and almost no expert keeps its row."""
    experts = np.arange(n_expert, dtype=np.int64)
    return np.stack([(n_expert - 1 - experts + layer) % n_expert for layer in range(n_layer)]).astype(np.int32)


MODE_OFF = C_MODE_OFF
MODE_CAPTURE = C_MODE_CAPTURE
MODE_STREAM = C_MODE_STREAM
MODE_REFERENCE = C_MODE_REFERENCE

# the capture's use bits, for the callers of captured_weights
CAPTURE_MUL_MAT = USE_MUL_MAT
CAPTURE_MUL_MAT_ID = USE_MUL_MAT_ID
CAPTURE_OTHER = USE_OTHER

# EngineOptions.page_release's names, as the C side holds them (stream_t.defer_release)
PAGE_RELEASES = ("inline", "ahead", "all")
# the eviction rules by their ``RULE_*`` code, and ``--cache-policy``'s values as ``core_set_rule``
# takes them (-1: adaptive, with the domain chooser's window and margin)
RULES = ("lru", "slru", "lfu")
EVICTION_CODES = {"lru": RULE_LRU, "slru": RULE_SLRU, "lfu": RULE_LFU, "adaptive": -1}
import bmoe.domain.streaming.rule_chooser as rule_chooser  # its window and margin, read at configure


cdef class ExpertStreamer:
    """Owns the streaming state; keep it alive as long as the context that calls it.

    ``fault_flag_address``: the int the context's abort callback polls for faults
    (``AbortFlag.fault_address``); 0 for none (tests of the mechanism alone).
    """

    cdef stream_t * s
    cdef object _hook

    def __cinit__(self, *, int n_layer, int n_expert, int n_proj, uintptr_t fault_flag_address=0):
        if n_layer <= 0 or n_expert <= 0 or not 0 < n_proj <= 4:
            raise ValueError("n_layer and n_expert must be positive, n_proj in 1..4")
        self.s = stream_new(n_layer, n_expert, n_proj, <int *> fault_flag_address)
        if self.s == NULL:
            raise MemoryError()
        self.s.read_in_place = 1  # EngineOptions' default, until configure
        self.s.wake_all = 0
        self._hook = None

    def __dealloc__(self):
        with nogil:
            stream_free(self.s)
        self.s = NULL

    def close(self):
        """Stop serving (the callback does nothing from now on), close the files and free the
        buffers now; the cache's bookkeeping stays readable. Between decodes. Idempotent."""
        self.s.mode = C_MODE_OFF
        stop_rank_worker(self.s)
        with nogil:
            lanes_close(self.s)
        self.s.hook = NULL
        self._hook = None

    @property
    def closed(self) -> bool:
        return self.s.fds == NULL

    # -- wiring ----------------------------------------------------------------------------

    @property
    def callback_address(self) -> int:
        return <uintptr_t> &stream_callback

    @property
    def user_data_address(self) -> int:
        return <uintptr_t> self.s

    @property
    def mode(self) -> int:
        return self.s.mode

    @property
    def compute_buffer(self) -> int:
        """The address of the ``ggml_backend_buffer`` the last graph's routing node lived in
        (llama.cpp's compute buffer, where it is host memory), 0 before any graph ran."""
        return <uintptr_t> self.s.compute_buffer

    @mode.setter
    def mode(self, int value):
        if value not in (MODE_OFF, MODE_CAPTURE, MODE_STREAM, MODE_REFERENCE):
            raise ValueError(f"unknown mode {value}")
        if value in (MODE_STREAM, MODE_REFERENCE) and self.s.fds == NULL:
            raise ValueError("open the model files first")
        if value == MODE_REFERENCE and self._hook is None:
            raise ValueError("set the reference hook first")
        self.s.mode = value

    @property
    def decode_rows(self) -> int:
        return self.s.decode_rows

    @decode_rows.setter
    def decode_rows(self, int n):
        """A graph call of at most ``n`` tokens is a decode step of ``n`` sequences (one
        token each): it counts as decode, not as a prefill's scan, and reads no layer ahead.
        1 (one sequence) by default. Between decodes only."""
        self.s.decode_rows = n if n > 1 else 1

    # -- decode routing (prediction, route-ahead, dropping, substitution) -------------------

    def set_router(self, int n_embd, int k, int gating):
        """Make the routing policies possible: the router input's width, the experts per
        token and llama.cpp's gating function (1 softmax, 2 sigmoid, 3 softmax over the
        selected logits, 4 sqrt(softplus)). Then give each MoE layer's router with
        ``set_gate``. Between decodes only."""
        if n_embd <= 0 or not 0 < k <= self.s.core.n_expert or gating not in (1, 2, 3, 4):
            raise ValueError("need n_embd > 0, 0 < k <= n_expert and a gating function in 1..4")
        if routing_alloc(self.s, n_embd, k, gating) < 0:
            raise MemoryError()

    def set_gate(self, int layer, uintptr_t weights, uintptr_t bias=0, uintptr_t selection_bias=0):
        """Layer ``layer``'s router: F32 rows ``[n_expert][n_embd]`` at ``weights``, an
        optional F32 router bias and selection bias (``[n_expert]`` each). The memory must
        outlive the streamer's use of it."""
        if not 0 <= layer < self.s.core.n_layer:
            raise ValueError("layer out of range")
        if weights == 0:
            raise ValueError("no router weights")
        self.s.r.gate_w[layer] = <const float *> weights
        self.s.r.gate_b[layer] = <const float *> bias
        self.s.r.sel_b[layer] = <const float *> selection_bias

    def routing_stats(self):
        """The routing policies' counters (cumulative)."""
        return routing_stats(self.s)

    # -- traces (--route-trace, --io-trace) ----------------------------------------------

    def enable_traces(self, *, bint route=False, bint io=False, int64_t io_capacity=1 << 20):
        """Record every layer call's routing (``route``) and every projection read (``io``,
        at most ``io_capacity`` reads between two drains; more are counted lost). Between
        decodes only; ``drain_traces`` after each request."""
        if io_capacity < 1:
            raise ValueError("io_capacity must be >= 1")
        if traces_enable(self.s, route, io, io_capacity) < 0:
            raise MemoryError()

    def drain_traces(self):
        """The rows recorded since the last drain (then forgotten), once no read is running:
        ``{"ubatches": [(number, n_tokens)], "route": [(ubatch, token, layer, slot, expert,
        weight, residency, dropped)], "io": [(ubatch, layer, proj, expert, lane, spec,
        offset, req_bytes, read_bytes, latency_ns)], "io_lost": n}``."""
        return traces_drain(self.s)

    def set_reference_hook(self, hook):
        """``hook(layer, ids, n_tokens) -> int`` serves a layer in ``MODE_REFERENCE``: 1 (or
        True) once every routed expert is in memory, 2 where the policy passed the call (the
        layer held whole: its routing is not counted); 0 (or an exception) faults the
        streamer."""
        self._hook = hook
        self.s.hook = <PyObject *> hook

    # -- the decode routing of the reference hook (mechanism only: the decisions are
    # ``bmoe.domain.streaming.decode_routing``'s) -----------------------------------------

    @property
    def reference_routing(self) -> bool:
        return self.s.ref_routing != 0

    @reference_routing.setter
    def reference_routing(self, bint on):
        """In ``MODE_REFERENCE``, expose each decode token's router to the hook (the
        ``call_*`` methods, valid only while the hook runs). Needs ``set_router``."""
        if on and not self.s.r.ready:
            raise ValueError("set_router first")
        self.s.ref_routing = 1 if on else 0

    @property
    def router_k(self) -> int:
        """The experts per token given to ``set_router`` (0 before)."""
        return self.s.r.k if self.s.r.ready else 0

    @property
    def gating(self) -> int:
        """The gating function given to ``set_router`` (0 before)."""
        return self.s.r.gating if self.s.r.ready else 0

    def gate_layers(self):
        """The layers whose router was given (``set_gate``)."""
        return [i for i in range(self.s.core.n_layer) if self.s.r.gate_w[i] != NULL]

    @property
    def reference_call(self):
        """The decode layer call the reference hook is serving (``ReferenceCall``; its
        methods are valid only while the hook runs)."""
        return ReferenceCall.bound(self.s, self)

    def captured(self):
        """``{tensor name: address}`` of every weight in host memory seen in capture mode."""
        return captured_table(self.s, 0)

    def captured_weights(self):
        """``{tensor name: (tensor address, uses)}`` of the same; ``uses``: 1 the matrix of a
        ``mul_mat``, 2 of a ``mul_mat_id``, 4 any other operand (or-ed over the nodes)."""
        return captured_table(self.s, 1)

    def captured_on_devices(self):
        """``{tensor name: tensor address}`` of the weights capture saw on a device."""
        return captured_table(self.s, 2)

    def set_projection_repack(self, int layer, int proj, uintptr_t template, uintptr_t tensor_set):
        """From now on, write projection ``proj`` of ``layer`` repacked: through
        ``tensor_set`` (``ggml_backend_tensor_set``) on a copy of ``template`` (one expert's
        shape in llama.cpp's CPU_REPACK buffer type, ``weight_repack.Templates``) pointed at
        the slice. Only between decodes, before anything of the projection is resident."""
        projection_repack(self.s, layer, proj, <ggml_tensor *> template, <tensor_set_f> tensor_set)

    def projection_template(self, int layer, int proj) -> int:
        """The template projection ``proj`` of ``layer`` is repacked through (0: it lands as
        read): what an expert store repacks with."""
        return <uintptr_t> projection(self.s, layer, proj).repack

    def read_projection_from(self, int layer, int proj, int file_index, int64_t file_offset):
        """From now on, read projection ``proj`` of ``layer`` at ``file_offset`` of open file
        ``file_index`` (an expert store: its slices already in the layout the graph computes
        with), landing as read: no repack. Only between decodes, before anything of the
        projection is resident."""
        cdef proj_t * pr = projection(self.s, layer, proj)
        if pr.base == NULL:
            raise ValueError(f"projection {proj} of layer {layer} is not set")
        if not 0 <= file_index < self.s.n_files or file_offset < 0:
            raise ValueError("no such open file, or a negative offset")
        pr.file_index = file_index
        pr.file_offset = file_offset
        pr.repack = NULL

    def projection_repacked(self, int layer, int proj) -> bool:
        """Whether projection ``proj`` of ``layer`` is written repacked."""
        if not (0 <= layer < self.s.core.n_layer and 0 <= proj < self.s.n_proj):
            return False
        return self.s.projs[layer * self.s.n_proj + proj].repack != NULL

    @property
    def capture_overflow(self) -> bool:
        """True when the graph had more weights than capture can record (``MAX_CAPTURE``)."""
        return self.s.capture_overflow != 0

    def set_projection(self, int layer, int proj, uintptr_t base, int64_t slice_bytes,
                       int file_index, int64_t file_offset):
        """Declare where projection ``proj`` of ``layer`` lives in memory and in its file."""
        projection_declare(self.s, layer, proj, <char *> base, slice_bytes, file_index, file_offset)

    def set_backend_api(self, uintptr_t tensor_get, uintptr_t buffer_is_host, uintptr_t nbytes):
        """ggml's ``ggml_backend_tensor_get``, ``_buffer_is_host``, ``ggml_nbytes``: a layer
        computed on a device gives its routing ids from there."""
        self.s.tensor_get = <tensor_get_f> tensor_get
        self.s.buffer_is_host = <buffer_is_host_f> buffer_is_host
        self.s.nbytes = <nbytes_f> nbytes

    def serve_elsewhere(self, int layer):
        """``layer``'s experts are resident on a device: its routing is not served."""
        if not 0 <= layer < self.s.core.n_layer:
            raise ValueError("layer out of range")
        self.s.layer_elsewhere[layer] = 1

    def entry_bytes(self, int layer) -> int:
        """Bytes of one entry of ``layer`` (all its projections); 0 without experts."""
        if not 0 <= layer < self.s.core.n_layer:
            return 0
        return self.s.core.entry_bytes[layer]

    @property
    def n_layer(self) -> int:
        return self.s.core.n_layer

    @property
    def n_expert(self) -> int:
        return self.s.core.n_expert

    def open_files(self, paths, *, bint odirect=True, int n_lanes=4):
        """Open the model files for reading (``O_DIRECT`` when asked and possible).

        Returns True when every file was opened with ``O_DIRECT``, False when it fell back
        to buffered reads (or was asked to).
        """
        if n_lanes < 1:
            raise ValueError("n_lanes must be >= 1")
        if self.s.fds != NULL:
            raise ValueError("files are already open")
        return lanes_open(self.s, paths, odirect, n_lanes)

    # -- reads for the expert-source adapter -----------------------------------------------

    def read_entry(self, int layer, int expert, int lane):
        """Read every projection of one entry into its memory, on ``lane``'s bounce buffer
        (one caller per lane at a time), without the GIL. Returns True, or False after
        recording a read fault (sticky; the fault flag is raised)."""
        cdef int result = 0
        cdef int32_t idx
        if self.s.fds == NULL:
            raise ValueError("the streamer is closed")
        if not (0 <= layer < self.s.core.n_layer and 0 <= expert < self.s.core.n_expert):
            raise ValueError("entry out of range")
        if not 0 <= lane < self.s.n_lanes:
            raise ValueError("lane out of range")
        idx = layer * self.s.core.n_expert + expert
        with nogil:
            result = read_entry_now(self.s, idx, lane)
        return result == 0

    def release_entry(self, int layer, int expert):
        """Give back the pages of one entry (it reads as zeros until read again)."""
        if not (0 <= layer < self.s.core.n_layer and 0 <= expert < self.s.core.n_expert):
            raise ValueError("entry out of range")
        drop_pages(self.s, layer, expert)

    # -- the setup knobs ---------------------------------------------------------------------

    def configure(self, settings):
        """Apply the setup knobs, ``settings``: a ``StreamerSettings``
        (``bmoe.domain.streaming.streamer_settings``), read by its attributes. Once, at
        setup, between decodes: after ``set_router`` where a routing policy runs, before
        the first decode. Everything is checked before anything is set; then, in order, the
        engine options (``settings.engine``, resolved: ``rank_worker`` True or False), the
        cache's eviction rule, the reads ahead, the decode routing policies (the rank worker
        started where they rank and it may run) and passing layers. The budget,
        ``decode_rows`` and ``mode`` are not here: they change while the streamer runs."""
        engine = settings.engine
        routing = settings.routing
        cdef int predict = (1 if routing.predict else 0) | (2 if routing.predict_prefetch else 0)
        cdef int page_release = -1
        if engine.page_release in PAGE_RELEASES:
            page_release = PAGE_RELEASES.index(engine.page_release)
        cdef int lane_delay_us = engine.lane_delay_us
        cdef int half_life = settings.half_life
        cdef int prefetch_k = settings.prefetch_k
        cdef int spec_max = routing.spec_max
        cdef int predict_depth = routing.predict_depth
        cdef int route_ahead = routing.route_ahead
        cdef double drop_cold = routing.drop_cold
        substitute = routing.substitute
        if engine.rank_worker is None:
            raise ValueError("engine.rank_worker must be decided (True or False)")
        if page_release < 0:
            raise ValueError(f"page_release is one of {', '.join(PAGE_RELEASES)}")
        if lane_delay_us < 0:
            raise ValueError("lane_delay_us must be >= 0")
        if settings.eviction not in EVICTION_CODES or half_life < 1:
            raise ValueError(f"eviction is one of {', '.join(EVICTION_CODES)}, half_life >= 1")
        if prefetch_k < 0:
            raise ValueError("prefetch depth must be >= 0")
        if spec_max < 1 or route_ahead < 0 or drop_cold < 0:
            raise ValueError("invalid routing settings")
        if not 1 <= predict_depth <= MAX_PREDICT_DEPTH:
            raise ValueError(f"predict_depth must be in 1..{MAX_PREDICT_DEPTH}")
        if substitute is not None and substitute < 0:
            raise ValueError("the substitution margin must be >= 0")
        if (predict or route_ahead or drop_cold > 0 or substitute is not None) and not self.s.r.ready:
            raise ValueError("set_router first")
        # the engine options
        self.s.proj_waits = 1 if engine.projection_waits else 0
        self.s.orphan_reads = 1 if engine.orphan_reads else 0
        self.s.recycle = 1 if engine.page_recycle else 0
        self.s.read_in_place = 1 if engine.read_in_place else 0
        self.s.wake_all = 1 if engine.wake_lanes == "all" else 0
        n_layer, n_expert = self.s.core.n_layer, self.s.core.n_expert
        if engine.expert_rows == "shuffled":
            self.set_rows(shuffled_rows(n_layer, n_expert))
        elif settings.victims in ("layer", "auto"):  # a miss read into its victim's row: rows in order at first
            self.set_rows(np.tile(np.arange(n_expert, dtype=np.int32), (n_layer, 1)))
        else:
            self.set_rows(None)
        self.s.rows_shuffled = 1 if engine.expert_rows == "shuffled" else 0
        self.s.defer_release = page_release
        self.s.lane_delay_us = lane_delay_us
        self.s.r.use_worker = 1 if engine.rank_worker else 0
        # the cache's eviction rule (the reference policy's cache has its own, the same); the
        # victims' scope first: the ghosts copy it
        self.s.core.layer_victims = 1 if settings.victims == "layer" else 0
        if core_set_rule(self.s.core, EVICTION_CODES[settings.eviction], half_life,
                         rule_chooser.WINDOW_TOKENS, rule_chooser.MARGIN_PERMILLE) != 0:
            raise MemoryError("no memory for the adaptive cache's ghosts")
        core_free(self.s.core.twin)  # auto: the scope twin (global first, the twin layer)
        self.s.core.twin = NULL
        if settings.victims == "auto" and core_make_twin(self.s.core, settings.eviction in ("lfu", "adaptive")) != 0:
            raise MemoryError("no memory for the cache's scope twin")
        # reads ahead
        self.s.prefetch_k = prefetch_k
        self.s.prefill_ahead = 1 if settings.prefill_ahead else 0
        # the decode routing policies
        self.s.r.predict = predict
        self.s.r.predict_auto = 1 if routing.predict_auto and predict & 2 else 0
        self.s.r.gate_open = 0 if self.s.r.predict_auto else 1
        self.s.r.spec_max = spec_max
        self.s.r.predict_depth = predict_depth
        self.s.r.route_ahead = route_ahead
        self.s.r.drop_f = drop_cold
        self.s.r.subst_l = -1.0 if substitute is None else substitute
        if not self.s.r.use_worker:
            stop_rank_worker(self.s)
        elif (predict or route_ahead) and start_rank_worker(self.s) != 0:
            self.s.r.use_worker = 0  # rank on the eval thread, as without a worker
        # passing layers held whole
        self.s.pass_layers = 1 if settings.pass_layers else 0

    def settings(self):
        """The setup knobs as the C side holds them, under ``StreamerSettings``' field names
        (``routing``'s ``predict``: bit 1 logs the stale gate's agreement, bit 2 reads its
        guesses ahead). ``engine``'s ``page_recycle`` turns itself off for good once the
        kernel refuses a move; its ``rank_worker`` is off where the thread could not start."""
        cdef routing_t * r = &self.s.r
        return {
            "eviction": self.eviction,
            "half_life": self.s.core.half_life,
            "victims": "auto" if self.s.core.twin != NULL else self.victims,
            "prefetch_k": self.s.prefetch_k,
            "prefill_ahead": self.s.prefill_ahead != 0,
            "pass_layers": self.s.pass_layers != 0,
            "routing": {
                "predict": r.predict,
                "predict_auto": r.predict_auto != 0,
                "spec_max": r.spec_max,
                "predict_depth": r.predict_depth,
                "route_ahead": r.route_ahead,
                "drop_cold": r.drop_f,
                "substitute": None if r.subst_l < 0 else r.subst_l,
            },
            "engine": {
                "projection_waits": self.s.proj_waits != 0,
                "orphan_reads": self.s.orphan_reads != 0,
                "rank_worker": r.use_worker != 0,
                "page_recycle": self.s.recycle != 0,
                "page_release": PAGE_RELEASES[self.s.defer_release],
                "read_in_place": self.s.read_in_place != 0,
                "wake_lanes": "all" if self.s.wake_all else "each",
                "expert_rows": "shuffled" if self.s.rows_shuffled else "own",
                "lane_delay_us": self.s.lane_delay_us,
            },
        }

    # -- the cache (fast path) -------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self.s.core.budget_bytes

    @property
    def eviction(self) -> str:
        """The eviction configured (``adaptive`` where ghosts run; ``rule``: the one in charge)."""
        if self.s.core.ghost[0] != NULL:
            return "adaptive"
        return RULES[self.s.core.rule]

    @property
    def rule(self) -> str:
        """The eviction rule in charge now (adaptive: the chooser's)."""
        return RULES[self.s.core.rule]

    @property
    def victims(self) -> str:
        """Whose entries a miss evicts now (``--cache-victims``; under ``auto``, the scope chosen)."""
        return "layer" if self.s.core.layer_victims else "global"

    def set_victims(self, str victims):
        """``--cache-victims auto``'s choice (``global`` or ``layer``), from the next request on;
        between decodes (the eval thread reads it in the callback). Needs the rows
        (``ValueError`` for ``layer`` without them: a miss must be read into its victim's row)."""
        if victims not in ("global", "layer"):
            raise ValueError("victims is global or layer")
        if victims == "layer" and self.s.row_of == NULL:
            raise ValueError("victims from the missing layer need the expert rows")
        core_set_victims(self.s.core, 1 if victims == "layer" else 0)

    def set_rows(self, rows):
        """Where each expert's bytes live (``stream/rows.pxi``): ``rows`` ``[n_layer][n_expert]``
        int32, each layer's a permutation of its experts (the routing ids are rewritten to
        rows before the expert matmuls read them); None: expert e in row e. Before the first
        read only (``ValueError`` after, or for rows that are not permutations)."""
        cdef int32_t[:, ::1] view
        cdef core_t * c = self.s.core
        if c.resident_bytes > 0 or self.s.landed_bytes > 0:
            raise ValueError("the experts' rows are set before the first read")
        if rows is None:
            set_rows(self.s, NULL)
            return
        table = np.ascontiguousarray(rows, dtype=np.int32)
        if table.shape != (c.n_layer, c.n_expert):
            raise ValueError(f"rows must be [{c.n_layer}][{c.n_expert}], not {list(table.shape)}")
        if not (np.sort(table, axis=1) == np.arange(c.n_expert, dtype=np.int32)).all():
            raise ValueError("each layer's rows must be a permutation of its experts")
        view = table
        if set_rows(self.s, &view[0, 0]) != 0:
            raise MemoryError()

    def set_budget(self, int64_t budget_bytes):
        """Change the byte budget between decodes; evicts LRU-first down to it (waiting for
        reads ahead still running on an evicted entry)."""
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        core_set_budget(self.s.core, budget_bytes)
        drop_planned_evictions(self.s, False)
        release_all(self.s)

    def read_ahead(self, int layer, experts, bint hot=True, bint warm=False):
        """Read ``experts`` of ``layer`` ahead of need, as ``ExpertCachePolicy.prefetch``
        plans it (``hot``: a committed set, its residents touched and its reads entering
        probation's most recent end; else the cold end): queued on the lanes, returns at
        once with the number issued. A request that routes to one adopts its read. ``warm``:
        a usage profile's warm-up, counted apart from prefetches (``warm_issued``). Between
        decodes (the session's decode lock held), in ``MODE_STREAM``."""
        cdef int issued
        if self.s.fds == NULL or self.s.mode != C_MODE_STREAM:
            raise ValueError("reads ahead need the fast path streaming (MODE_STREAM)")
        if not 0 <= layer < self.s.core.n_layer or self.s.core.entry_bytes[layer] == 0:
            raise ValueError(f"layer {layer} has no routed experts")
        ids = [int(e) for e in experts]
        bad = [e for e in ids if not 0 <= e < self.s.core.n_expert]
        if bad:
            raise ValueError(f"expert id {bad[0]} out of range [0, {self.s.core.n_expert})")
        core_begin(self.s.core)
        for e in ids:
            core_want(self.s.core, e)
        with nogil:
            issued = prefetch_wanted(self.s, layer, hot, warm)
        return issued

    def evict_all(self):
        """Drop every resident expert (the next use reads it again)."""
        core_evict_all(self.s.core)
        drop_planned_evictions(self.s, False)
        release_all(self.s)

    def resident_entries(self):
        """Resident ``(layer, expert)`` entries, least recently used first."""
        out = []
        cdef int32_t i = self.s.core.head
        cdef int n_expert = self.s.core.n_expert
        while i >= 0:
            out.append((i // n_expert, i % n_expert))
            i = self.s.core.next[i]
        return out

    def expert_snapshot(self):
        """``(resident, routed)``: one ``bytes`` of ``n_layer * n_expert`` flags (1: the entry
        ``layer * n_expert + e`` is in the cache core; the fast path's, the reference
        policy keeps its own) and one of as many native ``int64`` counts (the routed slots
        that chose it since setup, both modes). Read-only and cheap (two copies); take it
        between decodes or under the lock the session holds around them."""
        cdef int64_t n = <int64_t> self.s.core.n_layer * self.s.core.n_expert
        resident = bytearray(n)
        routed = bytearray(n * sizeof(int64_t))
        cdef uint8_t * rp = <uint8_t *> (<char *> resident)
        cdef int64_t * cp = <int64_t *> (<char *> routed)
        copy_routing(self.s, rp, cp)
        return bytes(resident), bytes(routed)

    def stats(self):
        """The counters, under ``StreamCounters``' field names (``ExpertStreaming.counters``
        keeps the ones it has, nothing renamed), and the mechanism's own: ``topk_stops``,
        ``unplanned_waits``, ``recycling``, ``odirect``, ``device_topk``, ``lanes``."""
        cdef stream_t * s = self.s
        cdef core_t * c = s.core
        return {
            "requests": c.requests,
            "hits": c.hits,
            "misses": c.misses,
            "evictions": c.evictions,
            "rereads": c.rereads,
            "bytes_read": c.bytes_read,
            "io_s": s.io_s,
            "stall_s": s.stall_s,
            "stall_layers": tuple(s.stall_layer[i] for i in range(c.n_layer)),
            "stall_ahead_s": s.stall_ahead_s,
            "mgmt_s": s.mgmt_s,
            "release_s": s.release_s,
            "release_lanes_s": s.release_lanes_s,
            "releases_deferred": s.releases_deferred,
            "releases_cancelled": s.releases_cancelled,
            "evict_waits": s.evict_waits,
            "evict_wait_s": s.evict_wait_s,
            "reads_orphaned": s.orphaned,
            "orphans_cut": s.orphans_cut,
            "bytes_landed": s.landed_bytes,
            "bytes_in_place": s.in_place_bytes,
            "land_s": s.land_ns * 1e-9,
            "lane_cpu_s": s.lane_cpu_ns * 1e-9,
            "projection_waits": s.proj_splits,
            "pages_recycled": s.recycled,
            "topk_stops": s.topk_stops,
            "rows_rewritten": s.rows_rewritten,
            "rows_swapped": s.rows_swapped,
            "unplanned_waits": s.unplanned_waits,
            "passed": c.passed,
            "recycling": s.recycle != 0,
            "prefetch_issued": c.prefetch_issued,
            "prefetch_hits": c.prefetch_hits,
            "prefetch_wasted": c.prefetch_wasted,
            "warm_issued": c.warm_issued,
            "cache_rule": RULES[c.rule],
            "cache_victims": self.victims,
            "cross_evictions": c.cross_evictions,
            "twin_misses": c.twin.misses if c.twin != NULL else 0,
            "twin_cross_evictions": c.twin.cross_evictions if c.twin != NULL else 0,
            "rule_switches": c.switches,
            "ghost_wanted": c.ghost_wanted,
            "ghost_lru_hits": c.ghost_hits[RULE_LRU],
            "ghost_slru_hits": c.ghost_hits[RULE_SLRU],
            "ghost_lfu_hits": c.ghost_hits[RULE_LFU],
            "resident_bytes": c.resident_bytes,
            "budget_bytes": c.budget_bytes,
            "odirect": s.odirect != 0,
            "device_topk": s.device_topk,
            "lanes": s.n_lanes,
        }

    def fault(self):
        """The first fault (sticky): None, ``("read", file_index, offset, errno)``,
        ``("graph", layer, reason)`` or ``("hook", layer)``."""
        return fault_info(self.s)
