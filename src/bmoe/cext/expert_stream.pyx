# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Expert streaming: the C mechanism (memory, reads, the eval callback) around the cache core.

``ExpertStreamer`` owns a C eval callback for a llama context. Modes:

- ``MODE_CAPTURE``: during a warm-up decode, the ``ask`` pass records the address of every
  weight (leaf) tensor the graph reads, by name; nothing is computed differently.
- ``MODE_STREAM`` (the fast path): at every ``ffn_moe_topk-L`` node (its data ready, no
  expert of layer L used yet), the callback gathers the selected ids, lets the cache core
  (``cache_core.pxd``, which follows ``bmoe.domain.streaming.ExpertCachePolicy`` decision
  for decision) plan the request, gives back the evicted entries' pages and reads every
  missing expert slice of layer L before returning (``pread`` on N lanes, ``O_DIRECT``
  through page-aligned bounce buffers).
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
"""

from cpython.ref cimport PyObject
from libc.errno cimport EINTR, EIO, errno
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
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport close as c_close, pread, usleep

from bmoe.cext.cache_core cimport (
    core_begin,
    core_evict_all,
    core_free,
    core_new,
    core_plan,
    core_prefetch,
    core_set_budget,
    core_t,
    core_want,
)
from bmoe.cext.graph_names cimport PROBS_PREFIX_LEN, TOPK_PREFIX_LEN, parse_layer
from bmoe.cext.ggml cimport (
    GGML_MAX_SRC,
    GGML_OP_MUL_MAT,
    GGML_OP_MUL_MAT_ID,
    GGML_OP_NONE,
    GGML_TYPE_F32,
    GGML_TYPE_I32,
    bool,
    ggml_tensor,
)
from bmoe.cext.route_policy cimport (
    rp_agreement,
    rp_drop,
    rp_rank,
    rp_substitute,
    rp_weights,
    rp_worth_reading,
)
from libc.math cimport INFINITY, exp, log1p, sqrt

cdef extern from "fcntl.h" nogil:
    enum:
        O_DIRECT
    int posix_fadvise(int fd, long offset, long length, int advice)
    enum:
        POSIX_FADV_DONTNEED

cdef extern from "string.h" nogil:
    char * strerror(int errnum)

cdef extern from "sys/mman.h" nogil:
    void * mremap(void * old_address, size_t old_size, size_t new_size, int flags, void * new_address)
    enum:
        MREMAP_MAYMOVE
        MREMAP_FIXED

cdef enum:
    MREMAP_DONTUNMAP_FLAG = 4      # Linux 5.7+ (private anonymous mappings)
    MADV_POPULATE_READ_FLAG = 22   # Linux 5.14+

cdef extern from "pthread.h" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t * thread, void * attr, void * (*start)(void *) noexcept nogil, void * arg)
    int pthread_join(pthread_t thread, void ** retval)
    int pthread_mutex_init(pthread_mutex_t * m, void * attr)
    int pthread_mutex_destroy(pthread_mutex_t * m)
    int pthread_mutex_lock(pthread_mutex_t * m)
    int pthread_mutex_unlock(pthread_mutex_t * m)
    int pthread_cond_init(pthread_cond_t * c, void * attr)
    int pthread_cond_destroy(pthread_cond_t * c)
    int pthread_cond_wait(pthread_cond_t * c, pthread_mutex_t * m)
    int pthread_cond_broadcast(pthread_cond_t * c)
    int pthread_cond_signal(pthread_cond_t * c)

cdef extern from * nogil:
    """
    static inline int bmoe_claim(int * p) { return __sync_bool_compare_and_swap(p, 0, 1); }
    static inline void bmoe_store(int * p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline int bmoe_load(int * p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline long long bmoe_fetch_add(long long * p, long long v) {
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    }
    """
    int bmoe_claim(int * p)
    void bmoe_store(int * p, int v)
    int bmoe_load(int * p)
    long long bmoe_fetch_add(long long * p, long long v)

cdef enum:
    C_MODE_OFF = 0
    C_MODE_CAPTURE = 1
    C_MODE_STREAM = 2
    C_MODE_REFERENCE = 3

MODE_OFF = C_MODE_OFF
MODE_CAPTURE = C_MODE_CAPTURE
MODE_STREAM = C_MODE_STREAM
MODE_REFERENCE = C_MODE_REFERENCE

cdef enum:
    IO_IDLE = 0
    IO_QUEUED = 1
    IO_READING = 2
    IO_RELEASE = 3                 # evicted; its pages wait in the release ring
    IO_RELEASING = 4               # a thread is giving its pages back now
    IO_ORPHAN = 5                  # evicted while its read ran: the read stops at its next
                                   # projection and the lane gives the pages back (a load of
                                   # the entry meanwhile waits for that)

cdef enum:
    PAGE = 4096
    MAX_CAPTURE = 16384
    NAME_LEN = 64
    USE_MUL_MAT = 1        # a weight captured as the matrix of a mul_mat node
    USE_MUL_MAT_ID = 2     # ... of a mul_mat_id node (routed experts)
    USE_OTHER = 4          # ... as any other operand (get_rows, add, mul, ...)

# the capture's use bits, for the callers of captured_weights
CAPTURE_MUL_MAT = USE_MUL_MAT
CAPTURE_MUL_MAT_ID = USE_MUL_MAT_ID
CAPTURE_OTHER = USE_OTHER

# fault kinds
cdef enum:
    FAULT_NONE = 0
    FAULT_READ = 1
    FAULT_GRAPH = 2
    FAULT_HOOK = 3

# graph fault reasons
cdef enum:
    GRAPH_NO_EXPERTS = 1
    GRAPH_ID_RANGE = 2
    GRAPH_IDS_TYPE = 3

_GRAPH_REASONS = {
    GRAPH_NO_EXPERTS: "the graph routes experts at a layer where none were found in the file",
    GRAPH_ID_RANGE: "the router selected an expert id out of range",
    GRAPH_IDS_TYPE: "the routing ids are not 32-bit integers",
}


cdef struct proj_t:
    char * base            # address of expert 0 (NULL: this layer has no such projection)
    int64_t slice_bytes    # nb[2]
    int file_index
    int64_t file_offset    # of expert 0
    ggml_tensor * repack   # one expert's shape in llama.cpp's CPU_REPACK buffer type, with
                           # its traits (weight_repack.Templates); NULL: the file's layout


ctypedef void (*tensor_set_f)(ggml_tensor *, const void *, size_t, size_t) noexcept nogil


cdef struct job_t:
    char * dest
    int fd
    int64_t offset
    int64_t size
    int result             # 0, or -errno; -EIO for a short read
    int file_index
    ggml_tensor * repack   # the projection's template (NULL: copied as read)


cdef struct capture_t:
    char name[64]
    uintptr_t address
    ggml_tensor * tensor
    int uses               # USE_* bits: how the graph's nodes read it


cdef struct lanes_t:
    # Read lanes: lane 0 is the thread that asks for reads (llama.cpp's, inside the
    # callback), lanes 1..n-1 are worker threads that *block* on a condition variable while
    # the queue is empty (no spinning: on a 2-core machine a spinning lane team took the
    # cores from llama.cpp's compute threads). Each lane owns one bounce buffer. Work is a
    # queue of entries (layer * n_expert + e) to read: demand reads go to its front (the
    # asker reads them too), reads ahead to its back (the workers read them while llama.cpp
    # computes). An entry's ``io_state`` says whether it is queued, being read, or idle.
    pthread_mutex_t mu
    pthread_cond_t work            # workers: the queue is not empty (or stop)
    pthread_cond_t done            # an entry's read finished
    pthread_t * threads            # [n_workers]
    int n_workers
    int started                    # workers created (0 when none / joined)
    int stop
    int32_t * queue                # ring of entry indices [queue_cap]
    int queue_cap
    int queue_head
    int queue_len
    # Evicted entries whose pages are still to be given back (``madvise``): releasing them
    # is not on the path of a read. The asker releases them while it waits for its layer's
    # reads; a worker releases them when more than ``rel_bound`` wait (so resident memory
    # never exceeds the budget by more than ``rel_bound`` entries). An entry read again
    # before its turn keeps its pages (the read overwrites them): the release is cancelled.
    int32_t * rel                  # ring of entry indices [rel_cap]
    int rel_cap
    int rel_head
    int rel_len
    int rel_bound


cdef struct worker_arg_t:
    void * stream
    int lane


cdef struct route_rec_t:
    int32_t ubatch                 # the trace's ubatch number (see trace_t.ubatch)
    int32_t token                  # token index within the ubatch
    int16_t layer
    int16_t slot
    int32_t expert
    float weight                   # the routing weight, normalised over the token's selection
    uint8_t residency              # 0 miss, 1 hit, 2 hit on a read ahead
    uint8_t dropped


cdef struct io_rec_t:
    int32_t ubatch
    int16_t layer
    int16_t proj
    int32_t expert
    int16_t lane
    uint8_t spec                   # read ahead of need (1) or on demand (0)
    int64_t offset
    int64_t req_bytes
    int64_t read_bytes
    int64_t latency_ns


cdef struct trace_t:
    # --route-trace / --io-trace: rows kept in C, drained by Python between requests.
    int route_on
    int io_on
    int32_t ubatch                 # ubatches seen (a new one starts at a layer <= the last)
    int last_layer
    int32_t * ub_tokens            # [ub_cap]: tokens of each ubatch since the last drain
    int32_t ub_first               # the ubatch number of ub_tokens[0]
    int64_t ub_n
    int64_t ub_cap
    route_rec_t * route
    int64_t route_n
    int64_t route_cap
    io_rec_t * io
    int64_t io_n                   # appended atomically (lanes read in parallel)
    int64_t io_cap
    int64_t io_lost
    uint8_t * spec_entry           # [n_layer * n_expert]: queued as a read ahead
    uint8_t * status               # scratch [n_expert]: this request's residency per expert
    int active_reads               # reads running outside the lanes' mutex


cdef struct routing_t:
    # What the decode-time routing policies need and count. Rankings are made on the eval
    # thread at a layer's topk from that layer's router input (``x``) and the gate matrix of
    # a layer ahead, and are only used within the same decode (``token`` stamps them).
    int ready                      # set_router called: the buffers below exist
    int n_embd
    int k                          # the model's experts per token
    int gating                     # llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid,
                                   # 3 softmax over the selected logits, 4 sqrt(softplus)
    const float ** gate_w          # [n_layer]: F32 [n_expert][n_embd] router rows, or NULL
    const float ** gate_b          # [n_layer]: router bias [n_expert] (gpt-oss), or NULL
    const float ** sel_b           # [n_layer]: selection bias [n_expert] (exp_probs_b), or NULL
    int predict                    # bit 1: log the prediction's agreement; bit 2: read ahead
    int spec_max                   # predicted misses read per layer
    int route_ahead                # N: commit the ranking made N MoE layers earlier
    double drop_f                  # > 0: drop cold misses below drop_f / k
    double subst_l                 # >= 0: substitute within this score margin; < 0 off
    int disarmed                   # the watchdog stopped prediction and route-ahead
    # per decode
    int64_t token
    int last_layer
    const float * x                # this layer's router input (valid during its callback)
    int32_t * ranked               # [n_layer * k]
    double * ranked_w              # [n_layer * k]
    int64_t * ranked_token         # [n_layer]
    float * logits                 # scratch [n_expert]
    float * sel                    # scratch [n_expert]
    float * vals                   # scratch [n_expert]
    uint8_t * flags                # scratch [n_expert]
    uint8_t * taken                # scratch [n_expert], kept zeroed
    int32_t * ids                  # scratch [n_expert]
    int32_t * ids2                 # scratch [n_expert]
    double * w                     # scratch [n_expert]
    uint8_t * dropped              # [n_expert]: the slots the current layer dropped
    # counters
    int64_t * pred_slots           # [n_layer]
    int64_t * pred_agree           # [n_layer]
    int64_t ra_committed
    int64_t ra_passed
    int64_t ra_slots
    int64_t ra_agree
    int64_t decode_slots
    int64_t n_dropped
    int64_t n_substituted
    int64_t checks
    int64_t trips
    int trip_layer
    int trip_agree
    int64_t trip_token
    double rank_s                  # ranking: GEMV + top-k (eval thread, or the worker)
    double issue_s                 # issuing the reads of a ranking
    # the ranking worker: a layer's rankings are made on it while the eval thread serves
    # the layer's own load; the eval thread waits for them before it issues their reads
    # (the same point as without it: the decisions do not depend on timing)
    int use_worker                 # 1 (default): rank on the worker when it runs
    int w_started
    int w_stop
    int w_pending                  # rankings asked and not yet made
    int w_n
    int w_targets[2]
    pthread_t w_thread
    pthread_mutex_t w_mu
    pthread_cond_t w_cv
    double rank_wait_s             # the eval thread's wait for the worker's rankings


cdef struct stream_t:
    int mode
    core_t * core
    int n_proj
    proj_t * projs                 # [n_layer * n_proj]
    double io_s
    double mgmt_s
    # reads
    int * fds
    int n_files
    int odirect
    int n_lanes
    char ** bounce                 # [n_lanes], each bounce_size bytes, page aligned
    int64_t bounce_size
    tensor_set_f tensor_set        # ggml_backend_tensor_set (repacked projections only)
    ggml_tensor * lane_tensor      # [n_lanes]: each lane's copy of a template, pointed at the
                                   # slice it writes
    lanes_t lanes
    uint8_t * io_state             # [n_layer * n_expert]: IO_IDLE, IO_QUEUED, IO_READING,
                                   # IO_RELEASE, IO_RELEASING
    double stall_s                 # the callback's time waiting for reads
    double * stall_layer           # [n_layer]: stall_s by layer
    int recycle                    # hand evicted pages to the plan's reads (mremap); 0 once
                                   # the kernel refused (then pages are released as before)
    uint8_t * recycled_mark        # [n_layer * n_expert]: scratch, this plan's recycled victims
    int64_t recycled               # evicted entries whose pages went to a read
    int defer_release              # 1 (default): the pages of entries reads ahead evict go
                                   # back through the release ring; 2: a layer's own
                                   # evictions too; 0: all at once (A/B measurements)
    double release_s               # moving or giving evicted pages back (the eval thread)
    double release_lanes_s         # ... (worker lanes; under the lanes' mutex)
    int64_t releases_deferred      # evictions whose pages went to the release ring
    int64_t releases_cancelled     # ... and were read again before they were released
    int64_t evict_waits            # evicted entries whose running read the eval thread waited for
    double evict_wait_s            # ... and how long
    int orphan_reads               # 1 (default): a plan's victim still being read is left to
                                   # its lane (IO_ORPHAN) instead of waited for; 0: waited for
    int64_t orphaned               # victims left to their lane so
    int64_t orphans_cut            # orphaned reads that stopped before their last projection
    # projection waits: a layer's loads are queued at its topk and each node that reads one
    # of its expert projections waits, when it is asked for, for that projection of the
    # layer's experts only (the compute of one projection overlaps the reads of the next)
    int proj_waits                 # 1 (default): on, where worker lanes run; 0: wait at topk
    int pw_layer                   # the layer whose projections are awaited; -1: none
    int pw_n
    int32_t * pw_ids               # [n_expert]: its wanted entries
    int pw_done                    # bit p: projection p was waited for
    uint8_t * proj_ready           # [n_layer * n_expert]: bit p: projection p of an entry
                                   # being read is in memory (set by the worker lanes)
    int proj_order[4]              # the projections in the order the graph reads them (the
                                   # eval thread's copy; it learns it)
    int proj_order_packed          # ... published to the lanes in one store: 4 bits each
    int proj_seen                  # how many of them the graph has shown so far
    int64_t proj_splits            # nodes that waited for a projection
    int lane_delay_us              # tests only: worker lanes sleep this long before each
                                   # projection (a slow disk), so reads ahead are still
                                   # running when later plans evict them
    # reads ahead (--prefetch K): the previous decode token's routing of each layer
    int prefetch_k
    int prefill_ahead              # read the whole next layer ahead in a prefill batch
    int32_t * last_route           # [n_layer * n_expert]
    int * last_route_n             # [n_layer]
    worker_arg_t * worker_args     # [n_lanes]
    # decode routing (stale-gate prediction, route-ahead, dropping, substitution)
    routing_t r
    trace_t tr
    # faults (the first one wins; never cleared)
    int fault
    int fault_kind
    int fault_errno
    int fault_file
    int64_t fault_offset
    int fault_layer
    int fault_reason
    int * fault_flag               # polled by the abort callback
    # reference mode
    PyObject * hook                # callable(layer, ids) -> bool; owned by ExpertStreamer
    int ref_routing                # the hook runs the decode routing policies: a decode
                                   # token's call exposes its router (the ``call_*`` methods)
    ggml_tensor * ref_t            # the topk node of that call (NULL outside it)
    int ref_layer                  # ... and its layer
    float * ref_probs              # its router probabilities (NULL where not found)
    # capture
    capture_t * captured
    int n_captured
    int capture_overflow


cdef inline double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


# -- faults ------------------------------------------------------------------------------

cdef void raise_fault_flag(stream_t * s) noexcept nogil:
    if s.fault_flag != NULL:
        bmoe_store(s.fault_flag, 1)


cdef void read_fault(stream_t * s, int err, int file_index, int64_t offset) noexcept nogil:
    if bmoe_claim(&s.fault):
        s.fault_kind = FAULT_READ
        s.fault_errno = err
        s.fault_file = file_index
        s.fault_offset = offset
    raise_fault_flag(s)


cdef void graph_fault(stream_t * s, int layer, int reason) noexcept nogil:
    if bmoe_claim(&s.fault):
        s.fault_kind = FAULT_GRAPH
        s.fault_layer = layer
        s.fault_reason = reason
    raise_fault_flag(s)


cdef void hook_fault(stream_t * s, int layer) noexcept nogil:
    if bmoe_claim(&s.fault):
        s.fault_kind = FAULT_HOOK
        s.fault_layer = layer
    raise_fault_flag(s)


# -- memory ------------------------------------------------------------------------------

cdef inline int64_t interior(stream_t * s, int layer, int expert, int p, uintptr_t * p0) noexcept nogil:
    """The whole pages inside one projection slice: their start in ``p0``, their length."""
    cdef proj_t * pr = &s.projs[layer * s.n_proj + p]
    cdef uintptr_t start, end, p1
    p0[0] = 0
    if pr.base == NULL:
        return 0
    start = <uintptr_t> pr.base + <uintptr_t> (expert * pr.slice_bytes)
    end = start + <uintptr_t> pr.slice_bytes
    p0[0] = (start + PAGE - 1) & ~(<uintptr_t> (PAGE - 1))
    p1 = end & ~(<uintptr_t> (PAGE - 1))
    return <int64_t> (p1 - p0[0]) if p1 > p0[0] else 0


cdef void drop_pages(stream_t * s, int layer, int expert) noexcept nogil:
    """Give back the pages wholly inside each projection slice of one expert."""
    cdef int p
    cdef uintptr_t p0
    cdef int64_t n
    for p in range(s.n_proj):
        n = interior(s, layer, expert, p, &p0)
        if n > 0:
            madvise(<void *> p0, n, MADV_DONTNEED)


cdef int move_pages(stream_t * s, int32_t victim, int32_t target) noexcept nogil:
    """Move an evicted entry's pages under the slices of an entry about to be read (no page
    given back, none faulted in: the read overwrites them; the victim reads as zeros after).
    1 when moved; 0 when the slices' sizes differ (nothing done); -1 when the kernel refused
    (the victim's pages were then given back as usual)."""
    cdef int p
    cdef int n_expert = s.core.n_expert
    cdef int vl = victim // n_expert, ve = victim % n_expert
    cdef int tl = target // n_expert, te = target % n_expert
    cdef uintptr_t v0, t0
    cdef int64_t n
    for p in range(s.n_proj):
        if interior(s, vl, ve, p, &v0) != interior(s, tl, te, p, &t0):
            return 0
    for p in range(s.n_proj):
        n = interior(s, vl, ve, p, &v0)
        interior(s, tl, te, p, &t0)
        if n > 0 and mremap(<void *> v0, n, n, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP_FLAG,
                            <void *> t0) == MAP_FAILED:
            drop_pages(s, vl, ve)
            return -1
    return 1


cdef void recycle_planned(stream_t * s) noexcept nogil:
    """Hand the plan's evicted entries' pages to its loads, pair by pair, marking the victims
    handled (``recycled_mark`` 1). Victims must be settled; orphans (mark 2) and loads whose
    orphaned read still runs are skipped."""
    cdef int m, j = 0, r
    cdef int32_t v
    if not s.recycle:
        return
    for m in range(s.core.n_evictions):
        while j < s.core.n_loads and s.io_state[s.core.plan_loads[j]] == IO_ORPHAN:
            j += 1  # its orphaned read still runs into its pages: no move there
        if j >= s.core.n_loads:
            return
        v = s.core.plan_evictions[m]
        if s.recycled_mark[v]:
            continue  # orphaned
        r = move_pages(s, v, s.core.plan_loads[j])
        if r == 0:
            continue
        s.recycled_mark[v] = 1
        if r < 0:
            s.recycle = 0
            return
        s.recycled += 1
        j += 1


cdef bint settle_entry(stream_t * s, int32_t i, bint wait) noexcept nogil:
    """Before an evicted entry's pages go: cancel its queued read; a running one is waited
    for, or without ``wait`` (and with ``orphan_reads``) left to its lane, which gives the
    pages back when it ends (IO_ORPHAN). True when left so: the caller must not touch its
    pages (neither recycle nor release them)."""
    cdef double t0
    cdef bint orphan = False
    if s.lanes.started == 0 or s.io_state[i] == IO_IDLE:
        return False
    pthread_mutex_lock(&s.lanes.mu)
    if s.io_state[i] == IO_QUEUED:
        s.io_state[i] = IO_IDLE  # its queue slot is skipped when popped
    if s.io_state[i] == IO_READING:
        if not wait and s.orphan_reads:
            s.io_state[i] = IO_ORPHAN
            s.orphaned += 1
            orphan = True
        else:
            t0 = now()
            while s.io_state[i] == IO_READING or s.io_state[i] == IO_ORPHAN:
                pthread_cond_wait(&s.lanes.done, &s.lanes.mu)
            s.evict_waits += 1
            s.evict_wait_s += now() - t0
    elif s.io_state[i] == IO_ORPHAN and wait:
        while s.io_state[i] == IO_ORPHAN or s.io_state[i] == IO_RELEASING:
            pthread_cond_wait(&s.lanes.done, &s.lanes.mu)
    pthread_mutex_unlock(&s.lanes.mu)
    return orphan


cdef void settle_planned(stream_t * s, bint wait) noexcept nogil:
    """Settle the plan's evicted entries (``settle_entry``), marking those left to their
    lane (``recycled_mark`` 2: neither recycled nor released here)."""
    cdef int m
    cdef int32_t i
    for m in range(s.core.n_evictions):
        i = s.core.plan_evictions[m]
        if settle_entry(s, i, wait):
            s.recycled_mark[i] = 2


cdef void drop_planned_evictions(stream_t * s, bint recycle) noexcept nogil:
    """Give back the plan's evicted entries' pages now (on this thread); with ``recycle``,
    those the plan's loads can take move there instead. With ``recycle`` (a layer's plan),
    a victim still being read is left to its lane; without (a budget change, evict_all),
    its read is waited for."""
    cdef int m
    cdef int32_t i
    cdef int n_expert = s.core.n_expert
    cdef double t0 = now()
    settle_planned(s, not recycle)
    if recycle:
        recycle_planned(s)
    for m in range(s.core.n_evictions):
        i = s.core.plan_evictions[m]
        if s.recycled_mark[i]:
            s.recycled_mark[i] = 0
            continue
        drop_pages(s, i // n_expert, i % n_expert)
    s.release_s += now() - t0


cdef void defer_planned_evictions(stream_t * s) noexcept nogil:
    """Hand the plan's evicted entries to the release ring (their queued reads cancelled,
    running ones waited for); without worker lanes, or with the ring full, release now."""
    cdef int m
    cdef int32_t i
    cdef double t0
    if s.core.n_evictions == 0:
        return
    if s.lanes.started == 0 or s.lanes.n_workers == 0 or not s.defer_release:
        drop_planned_evictions(s, True)
        return
    settle_planned(s, False)
    t0 = now()
    recycle_planned(s)
    s.release_s += now() - t0
    pthread_mutex_lock(&s.lanes.mu)
    for m in range(s.core.n_evictions):
        i = s.core.plan_evictions[m]
        if s.recycled_mark[i]:
            s.recycled_mark[i] = 0
            continue
        if s.lanes.rel_len < s.lanes.rel_cap:
            s.io_state[i] = IO_RELEASE
            s.lanes.rel[(s.lanes.rel_head + s.lanes.rel_len) % s.lanes.rel_cap] = i
            s.lanes.rel_len += 1
            s.releases_deferred += 1
        else:
            release_locked(s, i, &s.release_s)
    if s.lanes.rel_len > s.lanes.rel_bound:
        pthread_cond_broadcast(&s.lanes.work)
    pthread_mutex_unlock(&s.lanes.mu)


cdef bint release_one(stream_t * s, double * spent) noexcept nogil:
    """Give back the pages of the oldest entry of the release ring (mutex held on entry and
    on return; unlocked while releasing). False when nothing was waiting."""
    cdef int32_t i = -1
    while s.lanes.rel_len > 0:
        i = s.lanes.rel[s.lanes.rel_head]
        s.lanes.rel_head = (s.lanes.rel_head + 1) % s.lanes.rel_cap
        s.lanes.rel_len -= 1
        if s.io_state[i] == IO_RELEASE:  # stale slots (read again since) skip
            break
        i = -1
    if i < 0:
        return False
    release_locked(s, i, spent)
    return True


cdef void release_locked(stream_t * s, int32_t i, double * spent) noexcept nogil:
    """Give back entry ``i``'s pages (mutex held on entry and on return; unlocked while
    releasing, the entry RELEASING meanwhile), adding the time to ``spent``."""
    cdef double t0
    s.io_state[i] = IO_RELEASING
    pthread_mutex_unlock(&s.lanes.mu)
    t0 = now()
    drop_pages(s, i // s.core.n_expert, i % s.core.n_expert)
    t0 = now() - t0
    pthread_mutex_lock(&s.lanes.mu)
    spent[0] += t0
    s.io_state[i] = IO_IDLE
    pthread_cond_broadcast(&s.lanes.done)


cdef void claim_for_read(stream_t * s, int32_t i) noexcept nogil:
    """Mark entry ``i`` queued for a read (mutex held): a pending release is cancelled (the
    read overwrites the pages); a running one, or the read of an orphan (evicted while it
    ran: it stops at its next projection, then its pages go back), is waited for."""
    while s.io_state[i] == IO_RELEASING or s.io_state[i] == IO_ORPHAN:
        pthread_cond_wait(&s.lanes.done, &s.lanes.mu)
    if s.io_state[i] == IO_RELEASE:
        s.releases_cancelled += 1
    s.io_state[i] = IO_QUEUED
    s.proj_ready[i] = 0


cdef void release_all(stream_t * s) noexcept nogil:
    """Give back every page still waiting in the release ring."""
    if s.lanes.started == 0:
        return
    cdef double spent = 0.0
    pthread_mutex_lock(&s.lanes.mu)
    while release_one(s, &spent):
        pass
    pthread_mutex_unlock(&s.lanes.mu)
    s.release_s += spent


# -- reads -------------------------------------------------------------------------------

cdef int64_t read_exact(int fd, char * buf, int64_t length, int64_t offset) noexcept nogil:
    """Read up to ``length`` bytes; returns bytes read (short at EOF) or -errno."""
    cdef int64_t done = 0
    cdef long r
    while done < length:
        r = pread(fd, buf + done, length - done, offset + done)
        if r < 0:
            if errno == EINTR:
                continue
            return -errno
        if r == 0:
            break
        done += r
    return done


cdef void land(stream_t * s, job_t * job, int lane, const char * src) noexcept nogil:
    """Write one projection's bytes, read in the file's layout, into its slice: copied, or
    repacked by llama.cpp (``ggml_backend_tensor_set`` on the lane's copy of the template,
    pointed at the slice)."""
    cdef ggml_tensor * t
    if job.repack == NULL:
        memcpy(job.dest, src, job.size)
        return
    t = &s.lane_tensor[lane]
    t[0] = job.repack[0]
    t.data = job.dest
    s.tensor_set(t, src, 0, job.size)


cdef int run_job(stream_t * s, job_t * job, int lane) noexcept nogil:
    cdef int64_t a0, a1, got
    cdef char * buf
    if s.odirect:
        a0 = job.offset & ~(<int64_t> (PAGE - 1))
        a1 = (job.offset + job.size + PAGE - 1) & ~(<int64_t> (PAGE - 1))
        buf = s.bounce[lane]
        got = read_exact(job.fd, buf, a1 - a0, a0)
        if got < 0:
            return <int> got
        if got < job.offset + job.size - a0:
            return -EIO
        land(s, job, lane, buf + (job.offset - a0))
        return 0
    if job.repack != NULL:  # the repack reads another buffer than it writes
        got = read_exact(job.fd, s.bounce[lane], job.size, job.offset)
        if got >= job.size:
            land(s, job, lane, s.bounce[lane])
            return 0
    else:
        got = read_exact(job.fd, job.dest, job.size, job.offset)
    if got < 0:
        return <int> got
    if got < job.size:
        return -EIO
    return 0


cdef void fill_job(stream_t * s, job_t * job, int layer, int expert, int p) noexcept nogil:
    cdef proj_t * pr = &s.projs[layer * s.n_proj + p]
    job.dest = pr.base + expert * pr.slice_bytes
    job.fd = s.fds[pr.file_index]
    job.file_index = pr.file_index
    job.offset = pr.file_offset + expert * pr.slice_bytes
    job.size = pr.slice_bytes
    job.result = 0
    job.repack = pr.repack


cdef void trace_read(stream_t * s, job_t * job, int32_t idx, int p, int lane, double t0) noexcept nogil:
    """Append one projection read to the I/O trace (any lane; lost when the buffer is full)."""
    cdef int64_t i = bmoe_fetch_add(<long long *> &s.tr.io_n, 1)
    cdef io_rec_t * rec
    cdef int64_t a0, a1
    if i >= s.tr.io_cap:
        bmoe_fetch_add(<long long *> &s.tr.io_lost, 1)
        return
    rec = &s.tr.io[i]
    rec.ubatch = s.tr.ubatch
    rec.layer = <int16_t> (idx // s.core.n_expert)
    rec.proj = <int16_t> p
    rec.expert = idx % s.core.n_expert
    rec.lane = <int16_t> lane
    rec.spec = s.tr.spec_entry[idx]
    rec.offset = job.offset
    rec.req_bytes = job.size
    if s.odirect:
        a0 = job.offset & ~(<int64_t> (PAGE - 1))
        a1 = (job.offset + job.size + PAGE - 1) & ~(<int64_t> (PAGE - 1))
        rec.read_bytes = a1 - a0
    else:
        rec.read_bytes = job.size
    rec.latency_ns = <int64_t> ((now() - t0) * 1e9)


cdef int read_entry_now(stream_t * s, int32_t idx, int lane, bint stoppable=False) noexcept nogil:
    """Read every projection of entry ``idx`` on ``lane``; 0, or -errno after recording the
    read fault (sticky; the fault flag is raised). With ``stoppable``, 1 when it stopped
    between projections because the entry was evicted meanwhile (IO_ORPHAN; read without
    the mutex: at worst one projection more is read)."""
    cdef int j, p, result
    cdef job_t job
    cdef double t0 = 0.0
    cdef int layer = idx // s.core.n_expert
    cdef int order = bmoe_load(&s.proj_order_packed)  # one read: a whole permutation
    for j in range(s.n_proj):
        p = (order >> (4 * j)) & 15  # the graph's order: the first projection it reads first
        if s.projs[layer * s.n_proj + p].base == NULL:
            continue
        if stoppable and j > 0 and s.io_state[idx] == IO_ORPHAN:
            return 1
        if lane > 0 and s.lane_delay_us > 0:
            usleep(s.lane_delay_us)
        fill_job(s, &job, layer, idx % s.core.n_expert, p)
        if s.tr.io_on:
            t0 = now()
        result = run_job(s, &job, lane)
        if s.tr.io_on and result == 0:
            trace_read(s, &job, idx, p, lane, t0)
        if result != 0:
            read_fault(s, -result, job.file_index, job.offset)
            return result
        if lane > 0 and j < s.n_proj - 1:  # a node may wait for it (the last: IO_IDLE)
            pthread_mutex_lock(&s.lanes.mu)
            s.proj_ready[idx] |= <uint8_t> (1 << p)
            pthread_cond_broadcast(&s.lanes.done)
            pthread_mutex_unlock(&s.lanes.mu)
    return 0


cdef int queue_push(stream_t * s, int32_t idx, bint front) noexcept nogil:
    """Queue entry ``idx`` (mutex held); -1 when the ring is full."""
    if s.lanes.queue_len >= s.lanes.queue_cap:
        return -1
    if front:
        s.lanes.queue_head = (s.lanes.queue_head - 1 + s.lanes.queue_cap) % s.lanes.queue_cap
        s.lanes.queue[s.lanes.queue_head] = idx
    else:
        s.lanes.queue[(s.lanes.queue_head + s.lanes.queue_len) % s.lanes.queue_cap] = idx
    s.lanes.queue_len += 1
    return 0


cdef int32_t queue_pop(stream_t * s) noexcept nogil:
    """The next queued entry still waiting to be read (mutex held), or -1."""
    cdef int32_t idx
    while s.lanes.queue_len > 0:
        idx = s.lanes.queue[s.lanes.queue_head]
        s.lanes.queue_head = (s.lanes.queue_head + 1) % s.lanes.queue_cap
        s.lanes.queue_len -= 1
        if s.io_state[idx] == IO_QUEUED:  # stale slots (cancelled, or moved to the front) skip
            return idx
    return -1


cdef void read_popped(stream_t * s, int32_t idx, int lane) noexcept nogil:
    """Read a popped entry (mutex held on entry and on return). One evicted while it runs
    (IO_ORPHAN) stops at the next projection and its pages go back here."""
    cdef double t0
    cdef bint stopped
    s.io_state[idx] = IO_READING
    s.tr.active_reads += 1
    pthread_mutex_unlock(&s.lanes.mu)
    t0 = now()
    stopped = read_entry_now(s, idx, lane, True) == 1
    t0 = now() - t0
    pthread_mutex_lock(&s.lanes.mu)
    if stopped:
        s.orphans_cut += 1
    s.tr.active_reads -= 1
    s.io_s += t0
    if s.io_state[idx] == IO_ORPHAN:  # evicted meanwhile: its pages go back now
        release_locked(s, idx, &s.release_lanes_s)
        return
    s.io_state[idx] = IO_IDLE
    pthread_cond_broadcast(&s.lanes.done)


cdef void * lane_main(void * arg) noexcept nogil:
    cdef worker_arg_t * a = <worker_arg_t *> arg
    cdef stream_t * s = <stream_t *> a.stream
    cdef int32_t idx
    pthread_mutex_lock(&s.lanes.mu)
    while True:
        while not s.lanes.stop and s.lanes.queue_len == 0 and s.lanes.rel_len <= s.lanes.rel_bound:
            pthread_cond_wait(&s.lanes.work, &s.lanes.mu)
        if s.lanes.stop:
            break
        if s.lanes.rel_len > s.lanes.rel_bound and release_one(s, &s.release_lanes_s):
            continue
        idx = queue_pop(s)
        if idx >= 0:
            read_popped(s, idx, a.lane)
    pthread_mutex_unlock(&s.lanes.mu)
    return NULL


cdef bint is_wanted(stream_t * s, int32_t idx, int layer) noexcept nogil:
    return idx // s.core.n_expert == layer and s.core.wanted[idx % s.core.n_expert] != 0


cdef void queue_plan_first(stream_t * s) noexcept nogil:
    """Put the plan's loads, and the adopted entries' reads still queued, at the front of the
    lanes' queue, in plan order (mutex held)."""
    cdef int w
    cdef int32_t idx
    for w in range(s.core.n_adopted - 1, -1, -1):
        idx = s.core.plan_adopted[w]
        if s.io_state[idx] == IO_QUEUED and queue_push(s, idx, True) < 0:
            read_popped(s, idx, 0)  # the ring is full: read it here
    for w in range(s.core.n_loads - 1, -1, -1):
        idx = s.core.plan_loads[w]
        if s.tr.io_on:
            s.tr.spec_entry[idx] = 0
        claim_for_read(s, idx)
        if queue_push(s, idx, True) < 0:
            read_popped(s, idx, 0)


cdef void load_and_wait(stream_t * s, int layer) noexcept nogil:
    """Read the plan's loads and wait for them and for the adopted entries' reads: the loads
    and the adopted reads still queued go to the front; the asker reads them too (lane 0),
    then waits for those the workers are reading. Counts the wait as stall."""
    cdef int w
    cdef int32_t idx
    cdef bint pending
    cdef double spent = 0.0
    cdef double t0 = now()
    if s.lanes.started == 0:
        for w in range(s.core.n_loads):
            if s.tr.io_on:
                s.tr.spec_entry[s.core.plan_loads[w]] = 0
            read_entry_now(s, s.core.plan_loads[w], 0)
        t0 = now() - t0
        s.stall_s += t0
        s.stall_layer[layer] += t0
        return
    pthread_mutex_lock(&s.lanes.mu)
    queue_plan_first(s)
    if s.lanes.queue_len > 1:
        pthread_cond_broadcast(&s.lanes.work)
    while True:
        if s.lanes.queue_len > 0 and is_wanted(s, s.lanes.queue[s.lanes.queue_head], layer):
            idx = queue_pop(s)
            if idx >= 0:
                read_popped(s, idx, 0)
            continue
        pending = False
        for w in range(s.core.n_wanted):
            if s.io_state[layer * s.core.n_expert + s.core.order[w]] != IO_IDLE:
                pending = True
                break
        if not pending:
            break
        if release_one(s, &spent):  # the workers read this layer's experts: release meanwhile
            continue
        pthread_cond_wait(&s.lanes.done, &s.lanes.mu)
    pthread_mutex_unlock(&s.lanes.mu)
    s.release_s += spent
    t0 = now() - t0 - spent
    s.stall_s += t0
    s.stall_layer[layer] += t0


cdef bint queue_loads(stream_t * s, int layer) noexcept nogil:
    """Projection waits: queue the plan's loads and the adopted entries' queued reads at the
    front for the worker lanes, remember the layer's wanted entries, and return at once: each
    node that reads one of the layer's projections waits for it (``await_projection``).
    False where no worker lane runs (then ``load_and_wait``)."""
    cdef int w
    if not s.proj_waits or s.lanes.started == 0 or s.lanes.n_workers == 0:
        return False
    pthread_mutex_lock(&s.lanes.mu)
    queue_plan_first(s)
    pthread_cond_broadcast(&s.lanes.work)
    pthread_mutex_unlock(&s.lanes.mu)
    s.pw_n = 0
    for w in range(s.core.n_wanted):
        s.pw_ids[s.pw_n] = layer * s.core.n_expert + s.core.order[w]
        s.pw_n += 1
    s.pw_layer = layer
    s.pw_done = 0
    return True


cdef int reads_projection(stream_t * s, ggml_tensor * t) noexcept nogil:
    """The projection of the awaited layer that node ``t`` reads (a source inside one of its
    expert tensors), not waited for yet; -1 if none."""
    cdef int j, p
    cdef ggml_tensor * src
    cdef proj_t * pr
    cdef char * d
    for j in range(GGML_MAX_SRC):
        src = t.src[j]
        if src == NULL or src.data == NULL:
            continue
        d = <char *> src.data
        for p in range(s.n_proj):
            pr = &s.projs[s.pw_layer * s.n_proj + p]
            if pr.base != NULL and pr.base <= d < pr.base + pr.slice_bytes * s.core.n_expert:
                if not (s.pw_done >> p) & 1:
                    return p
    return -1


cdef void await_projection(stream_t * s, int p) noexcept nogil:
    """Wait until projection ``p`` of every wanted entry of the awaited layer is in memory
    (its read done, or that projection's part of it); give pages back meanwhile. The wait
    counts as stall."""
    cdef int w, k, packed
    cdef int32_t idx
    cdef bint pending
    cdef double spent = 0.0
    cdef double t0 = now()
    cdef int layer = s.pw_layer
    if s.proj_seen < s.n_proj:  # learn the graph's order: the lanes read in it
        for k in range(s.proj_seen):
            if s.proj_order[k] == p:
                break
        else:
            for k in range(s.n_proj):
                if s.proj_order[k] == p:
                    s.proj_order[k] = s.proj_order[s.proj_seen]
                    s.proj_order[s.proj_seen] = p
                    break
            s.proj_seen += 1
            packed = 0
            for k in range(s.n_proj):
                packed |= s.proj_order[k] << (4 * k)
            bmoe_store(&s.proj_order_packed, packed)
    s.pw_done |= 1 << p
    s.proj_splits += 1
    pthread_mutex_lock(&s.lanes.mu)
    while not s.fault:
        pending = False
        for w in range(s.pw_n):
            idx = s.pw_ids[w]
            if s.io_state[idx] != IO_IDLE and not (s.proj_ready[idx] >> p) & 1:
                pending = True
                break
        if not pending:
            break
        if release_one(s, &spent):
            continue
        pthread_cond_wait(&s.lanes.done, &s.lanes.mu)
    pthread_mutex_unlock(&s.lanes.mu)
    s.release_s += spent
    t0 = now() - t0 - spent
    s.stall_s += t0
    s.stall_layer[layer] += t0


cdef void issue_reads(stream_t * s) noexcept nogil:
    """Queue the prefetch plan's entries at the back for the workers (no waiting)."""
    cdef int w
    cdef int32_t idx
    if s.core.n_loads == 0:
        return
    if s.tr.io_on:
        for w in range(s.core.n_loads):
            s.tr.spec_entry[s.core.plan_loads[w]] = 1
    if s.lanes.started == 0 or s.lanes.n_workers == 0:  # nobody to read ahead: read now
        for w in range(s.core.n_loads):
            read_entry_now(s, s.core.plan_loads[w], 0)
        return
    pthread_mutex_lock(&s.lanes.mu)
    for w in range(s.core.n_loads):
        idx = s.core.plan_loads[w]
        claim_for_read(s, idx)
        if queue_push(s, idx, False) < 0:
            read_popped(s, idx, 0)
    pthread_cond_broadcast(&s.lanes.work)
    pthread_mutex_unlock(&s.lanes.mu)


cdef int start_lanes(stream_t * s) noexcept nogil:
    """Create the n_lanes - 1 worker threads; 0, or an errno."""
    cdef int i, err
    pthread_mutex_init(&s.lanes.mu, NULL)
    pthread_cond_init(&s.lanes.work, NULL)
    pthread_cond_init(&s.lanes.done, NULL)
    s.lanes.n_workers = 0
    s.lanes.started = 1
    for i in range(1, s.n_lanes):
        s.worker_args[i].stream = <void *> s
        s.worker_args[i].lane = i
        err = pthread_create(&s.lanes.threads[i - 1], NULL, lane_main, &s.worker_args[i])
        if err != 0:
            stop_lanes(s)
            return err
        s.lanes.n_workers += 1
    return 0


cdef void stop_lanes(stream_t * s) noexcept nogil:
    """Join the workers (reads queued and not started are abandoned)."""
    cdef int i
    if s.lanes.started == 0:
        return
    release_all(s)
    pthread_mutex_lock(&s.lanes.mu)
    s.lanes.stop = 1
    pthread_cond_broadcast(&s.lanes.work)
    pthread_mutex_unlock(&s.lanes.mu)
    for i in range(s.lanes.n_workers):
        pthread_join(s.lanes.threads[i], NULL)
    s.lanes.n_workers = 0
    s.lanes.started = 0
    s.lanes.stop = 0
    s.lanes.queue_len = 0
    s.lanes.rel_len = 0
    pthread_cond_destroy(&s.lanes.work)
    pthread_cond_destroy(&s.lanes.done)
    pthread_mutex_destroy(&s.lanes.mu)


# -- the fast path -----------------------------------------------------------------------

cdef int gather_ids(stream_t * s, ggml_tensor * t, int layer, const uint8_t * skip) noexcept nogil:
    """Start a core request with the node's ids (a decode token's ``skip``ped slots left
    out: dropped); -1 (after a graph fault) when it cannot."""
    cdef int64_t i, j
    cdef char * base = <char *> t.data
    if t.type != GGML_TYPE_I32:
        graph_fault(s, layer, GRAPH_IDS_TYPE)
        return -1
    core_begin(s.core)
    for j in range(t.ne[1]):
        for i in range(t.ne[0]):
            if skip != NULL and skip[i]:
                continue
            if core_want(s.core, (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]) < 0:
                graph_fault(s, layer, GRAPH_ID_RANGE)
                return -1
    return 0


cdef void prefetch_after(stream_t * s, int layer) noexcept nogil:
    """Decode only: remember this token's routing of ``layer``, then read ahead the next
    ``prefetch_k`` MoE layers' experts as the previous token routed them."""
    cdef int w, m = 0
    cdef int l = layer + 1
    cdef int n_expert = s.core.n_expert
    for w in range(s.core.n_wanted):
        s.last_route[layer * n_expert + w] = s.core.order[w]
    s.last_route_n[layer] = s.core.n_wanted
    while l < s.core.n_layer and m < s.prefetch_k:
        if s.core.entry_bytes[l] > 0:
            m += 1
            if s.last_route_n[l] > 0:
                core_begin(s.core)
                for w in range(s.last_route_n[l]):
                    core_want(s.core, s.last_route[l * n_expert + w])
                core_prefetch(s.core, l, False)
                defer_planned_evictions(s)
                issue_reads(s)
        l += 1


cdef void read_layer_ahead(stream_t * s, int layer) noexcept nogil:
    """A prefill batch that routed to at least half of ``layer``'s experts: read every expert
    of the next MoE layer ahead, in file order, while this layer computes."""
    cdef int e
    cdef int l = layer + 1
    while l < s.core.n_layer and s.core.entry_bytes[l] == 0:
        l += 1
    if l >= s.core.n_layer:
        return
    core_begin(s.core)
    for e in range(s.core.n_expert):
        core_want(s.core, e)
    core_prefetch(s.core, l, False)
    defer_planned_evictions(s)
    issue_reads(s)

# -- decode routing: prediction, route-ahead, dropping, substitution -----------------------

cdef inline float dot(const float * a, const float * b, int n) noexcept nogil:
    """A dot product with eight independent sums (the compiler can vectorise it)."""
    cdef float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0, tail = 0
    cdef int i = 0
    while i + 8 <= n:
        s0 += a[i] * b[i]
        s1 += a[i + 1] * b[i + 1]
        s2 += a[i + 2] * b[i + 2]
        s3 += a[i + 3] * b[i + 3]
        s4 += a[i + 4] * b[i + 4]
        s5 += a[i + 5] * b[i + 5]
        s6 += a[i + 6] * b[i + 6]
        s7 += a[i + 7] * b[i + 7]
        i += 8
    while i < n:
        tail += a[i] * b[i]
        i += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + tail


cdef inline double gate_value(int gating, double v) noexcept nogil:
    """The router's elementwise gating (softmax ones are handled by the caller)."""
    if gating == 2:
        return 1.0 / (1.0 + exp(-v))
    if gating == 4:
        return sqrt(v if v > 20.0 else log1p(exp(v)))
    return v


cdef bint routing_on(stream_t * s) noexcept nogil:
    cdef routing_t * r = &s.r
    return r.ready and (r.predict or r.route_ahead or r.drop_f > 0.0 or r.subst_l >= 0.0)


cdef int moe_layer_ahead(stream_t * s, int layer, int n) noexcept nogil:
    """The ``n``-th layer after ``layer`` with routed experts and a known router, or -1."""
    cdef int l = layer + 1
    cdef int seen = 0
    while l < s.core.n_layer:
        if s.core.entry_bytes[l] > 0 and s.r.gate_w[l] != NULL:
            seen += 1
            if seen == n:
                return l
        l += 1
    return -1


cdef void router_scores(stream_t * s, int layer, const float * x) noexcept nogil:
    """``r.logits`` = layer's router on ``x`` (+ its bias); ``r.sel`` = the selection score
    (the logits, or the gated probabilities plus the selection bias where there is one)."""
    cdef routing_t * r = &s.r
    cdef int e, n = s.core.n_expert
    cdef const float * W = r.gate_w[layer]
    cdef const float * b = r.gate_b[layer]
    cdef const float * sb = r.sel_b[layer]
    cdef double top, total
    for e in range(n):
        r.logits[e] = dot(W + <int64_t> e * r.n_embd, x, r.n_embd)
        if b != NULL:
            r.logits[e] += b[e]
    if sb == NULL:
        for e in range(n):
            r.sel[e] = r.logits[e]
        return
    if r.gating == 1:
        top = r.logits[0]
        for e in range(1, n):
            if r.logits[e] > top:
                top = r.logits[e]
        total = 0.0
        for e in range(n):
            total += exp(<double> r.logits[e] - top)
        for e in range(n):
            r.sel[e] = <float> (exp(<double> r.logits[e] - top) / total) + sb[e]
        return
    for e in range(n):
        r.sel[e] = <float> gate_value(r.gating, r.logits[e]) + sb[e]


cdef void make_ranking(stream_t * s, int target) noexcept nogil:
    """Rank ``target``'s experts on this layer's router input; keep ids and weights."""
    cdef routing_t * r = &s.r
    cdef int j
    cdef int32_t * ranked = &r.ranked[target * r.k]
    router_scores(s, target, r.x)
    rp_rank(r.sel, s.core.n_expert, r.k, ranked, r.flags)
    if r.gating == 1 or r.gating == 3:
        for j in range(r.k):
            r.vals[j] = r.logits[ranked[j]]
        rp_weights(r.vals, r.k, True, &r.ranked_w[target * r.k])
    else:
        for j in range(r.k):
            r.vals[j] = <float> gate_value(r.gating, r.logits[ranked[j]])
        rp_weights(r.vals, r.k, False, &r.ranked_w[target * r.k])
    r.ranked_token[target] = r.token


cdef void * rank_worker_main(void * arg) noexcept nogil:
    """Make the rankings the eval thread asks for (``w_targets``), on its layer's router
    input ``r.x`` (valid until the eval thread, which waits for them, leaves the callback)."""
    cdef stream_t * s = <stream_t *> arg
    cdef routing_t * r = &s.r
    cdef int j, n
    cdef int targets[2]
    cdef double t0
    pthread_mutex_lock(&r.w_mu)
    while True:
        while not r.w_stop and r.w_pending == 0:
            pthread_cond_wait(&r.w_cv, &r.w_mu)
        if r.w_stop:
            break
        n = r.w_n
        for j in range(n):
            targets[j] = r.w_targets[j]
        pthread_mutex_unlock(&r.w_mu)
        t0 = now()
        for j in range(n):
            make_ranking(s, targets[j])
        t0 = now() - t0
        pthread_mutex_lock(&r.w_mu)
        r.rank_s += t0
        r.w_pending = 0
        pthread_cond_broadcast(&r.w_cv)
    pthread_mutex_unlock(&r.w_mu)
    return NULL


cdef int start_rank_worker(stream_t * s) noexcept nogil:
    cdef routing_t * r = &s.r
    if r.w_started:
        return 0
    pthread_mutex_init(&r.w_mu, NULL)
    pthread_cond_init(&r.w_cv, NULL)
    r.w_stop = 0
    r.w_pending = 0
    if pthread_create(&r.w_thread, NULL, rank_worker_main, <void *> s) != 0:
        pthread_cond_destroy(&r.w_cv)
        pthread_mutex_destroy(&r.w_mu)
        return -1
    r.w_started = 1
    return 0


cdef void stop_rank_worker(stream_t * s) noexcept nogil:
    cdef routing_t * r = &s.r
    if not r.w_started:
        return
    pthread_mutex_lock(&r.w_mu)
    r.w_stop = 1
    pthread_cond_broadcast(&r.w_cv)
    pthread_mutex_unlock(&r.w_mu)
    pthread_join(r.w_thread, NULL)
    pthread_cond_destroy(&r.w_cv)
    pthread_mutex_destroy(&r.w_mu)
    r.w_started = 0


cdef int rank_targets(stream_t * s, int layer, int * targets, int * committed) noexcept nogil:
    """The layers a decode layer's router input ranks, in order: the next MoE layer
    (prediction: ``committed`` 0) and the one N MoE layers on (route-ahead: 1)."""
    cdef routing_t * r = &s.r
    cdef int n = 0, target
    if r.predict:
        target = moe_layer_ahead(s, layer, 1)
        if target >= 0:
            targets[n] = target
            committed[n] = 0
            n += 1
    if r.route_ahead:
        target = moe_layer_ahead(s, layer, r.route_ahead)
        if target >= 0:
            targets[n] = target
            committed[n] = 1
            n += 1
    return n


cdef bint ask_rankings(stream_t * s, int layer) noexcept nogil:
    """Hand this layer's rankings to the worker (before its load); False when it does not
    run or there is nothing to rank (``rank_ahead`` then ranks on this thread)."""
    cdef routing_t * r = &s.r
    cdef int committed[2]
    if not (r.w_started and r.use_worker) or r.x == NULL or r.disarmed:
        return False
    pthread_mutex_lock(&r.w_mu)
    r.w_n = rank_targets(s, layer, r.w_targets, committed)
    r.w_pending = 1 if r.w_n > 0 else 0
    if r.w_pending:
        pthread_cond_signal(&r.w_cv)
    pthread_mutex_unlock(&r.w_mu)
    return r.w_n > 0


cdef void await_rankings(stream_t * s) noexcept nogil:
    cdef routing_t * r = &s.r
    cdef double t0 = now()
    pthread_mutex_lock(&r.w_mu)
    while r.w_pending:
        pthread_cond_wait(&r.w_cv, &r.w_mu)
    pthread_mutex_unlock(&r.w_mu)
    r.rank_wait_s += now() - t0


cdef void find_router(ggml_tensor * t, int layer, ggml_tensor ** probs, ggml_tensor ** x) noexcept nogil:
    """From the topk node, walk back (a bounded search over sources) to the router's
    probabilities (``ffn_moe_probs-L``) and the router matmul's input."""
    cdef ggml_tensor * stack[64]
    cdef ggml_tensor * n
    cdef ggml_tensor * w
    cdef int top = 0, visits = 0, j
    stack[top] = t
    top += 1
    while top > 0 and visits < 64:
        top -= 1
        n = stack[top]
        visits += 1
        if probs[0] == NULL and strncmp(n.name, b"ffn_moe_probs-", PROBS_PREFIX_LEN) == 0 \
                and parse_layer(n.name, PROBS_PREFIX_LEN) == layer:
            probs[0] = n
        if x[0] == NULL and n.op == GGML_OP_MUL_MAT:
            w = n.src[0]
            if w != NULL and w.op == GGML_OP_NONE and is_gate_inp(w.name, layer):
                x[0] = n.src[1]
        if probs[0] != NULL and x[0] != NULL:
            return
        for j in range(10):
            if n.src[j] != NULL and top < 64:
                stack[top] = n.src[j]
                top += 1


cdef bint is_gate_inp(const char * name, int layer) noexcept nogil:
    """``name`` is ``blk.<layer>.ffn_gate_inp.weight``."""
    cdef int i = 4
    cdef int value = 0
    cdef int digits = 0
    if strncmp(name, b"blk.", 4) != 0:
        return False
    while name[i] >= 48 and name[i] <= 57 and digits < 9:
        value = value * 10 + (name[i] - 48)
        i += 1
        digits += 1
    return digits > 0 and value == layer and strncmp(name + i, b".ffn_gate_inp.weight", 21) == 0


cdef void write_ids(ggml_tensor * t, const int32_t * ids, int k) noexcept nogil:
    cdef int i
    cdef char * base = <char *> t.data
    for i in range(k):
        (<int32_t *> (base + i * t.nb[0]))[0] = ids[i]


cdef void watchdog(stream_t * s, int layer, int k) noexcept nogil:
    """Sampled check: this layer's own router, evaluated here on its input, must name the
    experts the graph's router chose (up to near ties); otherwise what the rankings read
    is not what the graph computes, and prediction and route-ahead are disarmed."""
    cdef routing_t * r = &s.r
    cdef int agree
    cdef int tolerated = k // 4 if k >= 4 else 1
    router_scores(s, layer, r.x)
    rp_rank(r.sel, s.core.n_expert, k, r.ids2, r.flags)
    agree = rp_agreement(r.ids2, k, r.ids, k)
    r.checks += 1
    if agree < k - tolerated:
        r.disarmed = 1
        r.trips += 1
        r.trip_layer = layer
        r.trip_agree = agree
        r.trip_token = r.token


cdef void drop_weights(routing_t * r, float * probs, int k) noexcept nogil:
    """Zero the dropped slots' weights in the router's probabilities (before the graph
    gathers them) and renormalise the survivors to the selection's total."""
    cdef int i
    cdef double s_all = 0.0, s_surv = 0.0, scale
    if r.gating == 3:  # weights = softmax over the selected logits
        for i in range(k):
            if r.dropped[i]:
                probs[r.ids[i]] = -INFINITY
        return
    for i in range(k):
        s_all += probs[r.ids[i]]
        if not r.dropped[i]:
            s_surv += probs[r.ids[i]]
    if s_surv <= 0.0:
        return
    scale = s_all / s_surv
    for i in range(k):
        if r.dropped[i]:
            probs[r.ids[i]] = 0.0
        else:
            probs[r.ids[i]] = <float> (probs[r.ids[i]] * scale)


cdef float * locate_router(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    """A decode token's layer call: point ``r.x`` at the router's input (NULL when it cannot
    be read as F32 ``[n_embd]``) and return the router's probabilities (F32 ``[n_expert]``),
    or NULL."""
    cdef ggml_tensor * pn = NULL
    cdef ggml_tensor * xn = NULL
    s.r.x = NULL
    find_router(t, layer, &pn, &xn)
    if (xn != NULL and xn.type == GGML_TYPE_F32 and xn.ne[0] == s.r.n_embd and xn.nb[0] == 4
            and xn.data != NULL):
        s.r.x = <const float *> xn.data
    if (pn != NULL and pn.type == GGML_TYPE_F32 and pn.ne[0] == s.core.n_expert and pn.nb[0] == 4
            and pn.data != NULL):
        return <float *> pn.data
    return NULL


cdef int route_decode(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    """A decode token's layer, before its load: count the prediction's agreement, commit
    route-ahead's ranking, substitute, drop. Returns the number of dropped slots (marked in
    ``r.dropped``: they are not read)."""
    cdef routing_t * r = &s.r
    cdef int i, e, changed, n_drop = 0
    cdef int k = <int> t.ne[0]
    cdef int n = s.core.n_expert
    cdef char * base = <char *> t.data
    cdef float * probs = NULL
    cdef int32_t * committed
    if layer <= r.last_layer:
        r.token += 1
    r.last_layer = layer
    r.x = NULL
    if k <= 0 or k > n:
        return 0
    for i in range(k):
        r.dropped[i] = 0
        r.ids[i] = (<int32_t *> (base + i * t.nb[0]))[0]
        if r.ids[i] < 0 or r.ids[i] >= n:
            return 0  # the load reports the graph fault
    probs = locate_router(s, t, layer)
    r.decode_slots += k
    if k != r.k:  # a top-k the rankings were not made for
        r.x = NULL
    if ((r.predict or r.route_ahead) and not r.disarmed and r.x != NULL and r.gate_w[layer] != NULL
            and r.token % 16 == 1):
        watchdog(s, layer, k)
    if r.predict and r.ranked_token[layer] == r.token:
        r.pred_slots[layer] += k
        r.pred_agree[layer] += rp_agreement(&r.ranked[layer * r.k], k, r.ids, k)
    if r.route_ahead:
        if not r.disarmed and r.ranked_token[layer] == r.token and k == r.k:
            committed = &r.ranked[layer * r.k]
            r.ra_agree += rp_agreement(committed, k, r.ids, k)
            r.ra_slots += k
            r.ra_committed += 1
            for i in range(k):
                r.ids[i] = committed[i]
            write_ids(t, r.ids, k)
        else:
            r.ra_passed += 1
    if r.subst_l >= 0.0 and probs != NULL:
        for e in range(n):
            r.flags[e] = s.core.resident[layer * n + e]
        for i in range(k):
            r.vals[i] = probs[r.ids[i]]
        changed = rp_substitute(r.ids, k, probs, n, r.flags, r.subst_l, r.vals, r.taken)
        for e in range(n):
            r.flags[e] = 0
        if changed:
            write_ids(t, r.ids, k)
            r.n_substituted += changed
    if r.drop_f > 0.0 and probs != NULL:
        for i in range(k):
            r.vals[i] = probs[r.ids[i]]
            r.flags[i] = s.core.resident[layer * n + r.ids[i]]
        rp_weights(r.vals, k, r.gating == 3, r.w)
        n_drop = rp_drop(r.w, r.flags, k, r.drop_f, r.dropped)
        for i in range(k):
            r.flags[i] = 0
        if n_drop:
            drop_weights(r, probs, k)
            r.n_dropped += n_drop
            for i in range(k):
                if r.dropped[i]:
                    map_zero_pages(s, layer, r.ids[i])
    return n_drop


cdef void map_zero_pages(stream_t * s, int layer, int expert) noexcept nogil:
    """A dropped expert is not read, but the graph still multiplies its (absent) slices by a
    zero weight: map its missing pages to the kernel's zero page in one call each
    (``MADV_POPULATE_READ``, Linux 5.14+; ignored where unknown) instead of letting the
    compute threads fault them in one page at a time. The bytes are the same zeros."""
    cdef int p
    cdef uintptr_t p0
    cdef int64_t n
    for p in range(s.n_proj):
        n = interior(s, layer, expert, p, &p0)
        if n > 0:
            madvise(<void *> p0, n, MADV_POPULATE_READ_FLAG)


cdef void issue_ranking(stream_t * s, int target, bint committed) noexcept nogil:
    """Read a ranking's experts ahead: drop-aware; a guess reads at most ``spec_max`` misses
    and enters cold, a committed routing reads them all and enters hot."""
    cdef routing_t * r = &s.r
    cdef int j, n_worth, misses = 0
    cdef int32_t e
    cdef int n = s.core.n_expert
    n_worth = rp_worth_reading(&r.ranked[target * r.k], &r.ranked_w[target * r.k], r.k, r.drop_f, r.ids2)
    core_begin(s.core)
    for j in range(n_worth):
        e = r.ids2[j]
        if committed or s.core.resident[target * n + e]:
            core_want(s.core, e)
        elif misses < r.spec_max:
            core_want(s.core, e)
            misses += 1
    core_prefetch(s.core, target, committed)
    defer_planned_evictions(s)
    issue_reads(s)


cdef void rank_and_issue(stream_t * s, int target, bint issue, bint committed, bint made) noexcept nogil:
    """Rank ``target`` on this layer's router input (unless the worker ``made`` it) and,
    with ``issue``, read its experts ahead."""
    cdef routing_t * r = &s.r
    cdef double t0 = now()
    if not made:
        make_ranking(s, target)
        r.rank_s += now() - t0
    t0 = now()
    if issue and s.core.budget_bytes > 0:
        issue_ranking(s, target, committed)
        r.issue_s += now() - t0


cdef void rank_ahead(stream_t * s, int layer, bint asked) noexcept nogil:
    """After a decode layer's load: rank the layers ahead on its router input (the stale
    gate for the next MoE layer; route-ahead's commitment N MoE layers on) and read ahead.
    When the worker was ``asked`` for the rankings, wait for them first (whether it finished
    during the load or not, the reads are issued here: the same decisions either way)."""
    cdef routing_t * r = &s.r
    cdef int j, n
    cdef int targets[2]
    cdef int committed[2]
    if asked:
        await_rankings(s)
    if r.x == NULL or r.disarmed:
        return
    n = rank_targets(s, layer, targets, committed)
    for j in range(n):  # a guess is read ahead only with --predict-prefetch
        rank_and_issue(s, targets[j], committed[j] or r.predict & 2, committed[j], asked)


# -- traces ----------------------------------------------------------------------------------

cdef void trace_ubatch(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    """Count ubatches (a graph's MoE layers come in increasing order) and their tokens."""
    cdef trace_t * tr = &s.tr
    cdef int32_t * grown
    if layer > tr.last_layer:
        tr.last_layer = layer
        return
    tr.last_layer = layer
    tr.ubatch += 1
    if tr.ub_n == tr.ub_cap:
        grown = <int32_t *> realloc(tr.ub_tokens, (2 * tr.ub_cap + 64) * sizeof(int32_t))
        if grown == NULL:
            return
        tr.ub_tokens = grown
        tr.ub_cap = 2 * tr.ub_cap + 64
    if tr.ub_n == 0:
        tr.ub_first = tr.ubatch
    tr.ub_tokens[tr.ub_n] = <int32_t> t.ne[1]
    tr.ub_n += 1


cdef void trace_route(stream_t * s, ggml_tensor * t, int layer, const uint8_t * skip) noexcept nogil:
    """Append the layer call's routing (after any rewrite), with each slot's residency in the
    plan just made and its normalised weight."""
    cdef trace_t * tr = &s.tr
    cdef routing_t * r = &s.r
    cdef int64_t i, j, need
    cdef int w, k = <int> t.ne[0]
    cdef int n = s.core.n_expert
    cdef char * base = <char *> t.data
    cdef ggml_tensor * pn = NULL
    cdef ggml_tensor * xn = NULL
    cdef float * probs = NULL
    cdef route_rec_t * grown
    cdef route_rec_t * rec
    cdef int32_t e
    cdef float vals[64]
    cdef double wts[64]
    need = tr.route_n + t.ne[0] * t.ne[1]
    if need > tr.route_cap:
        grown = <route_rec_t *> realloc(tr.route, (2 * need) * sizeof(route_rec_t))
        if grown == NULL:
            return
        tr.route = grown
        tr.route_cap = 2 * need
    for w in range(s.core.n_hits):
        tr.status[s.core.plan_hits[w] % n] = 1
    for w in range(s.core.n_adopted):
        tr.status[s.core.plan_adopted[w] % n] = 2
    find_router(t, layer, &pn, &xn)
    if pn != NULL and pn.type == GGML_TYPE_F32 and pn.ne[0] == n and pn.nb[0] == 4 and pn.data != NULL \
            and pn.ne[1] == t.ne[1] and k <= 64:  # weights for a top-k of up to 64
        probs = <float *> pn.data
    for j in range(t.ne[1]):
        if probs != NULL:
            for i in range(k):
                e = (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]
                vals[i] = probs[e + j * (pn.nb[1] // 4)] if 0 <= e < n else 0.0
            rp_weights(vals, k, r.gating == 3, wts)
        for i in range(k):
            e = (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]
            rec = &tr.route[tr.route_n]
            tr.route_n += 1
            rec.ubatch = tr.ubatch
            rec.token = <int32_t> j
            rec.layer = <int16_t> layer
            rec.slot = <int16_t> i
            rec.expert = e
            rec.weight = <float> wts[i] if probs != NULL else -1.0
            rec.dropped = 1 if skip != NULL and skip[i] else 0
            rec.residency = tr.status[e] if 0 <= e < n and not rec.dropped else 0
    for w in range(s.core.n_hits):
        tr.status[s.core.plan_hits[w] % n] = 0



cdef void demand(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    cdef int n_loads
    cdef double t0 = now()
    cdef double stall0 = s.stall_s
    cdef double rank0 = s.r.rank_s
    cdef double wait0 = s.r.rank_wait_s
    cdef const uint8_t * skip = NULL
    cdef bint routed = t.ne[1] == 1 and t.type == GGML_TYPE_I32 and routing_on(s)
    cdef bint asked = False
    if routed and route_decode(s, t, layer) > 0:
        skip = s.r.dropped
    if gather_ids(s, t, layer, skip) < 0:
        return
    n_loads = core_plan(s.core, layer, <int> t.ne[1])
    if n_loads < 0:
        graph_fault(s, layer, GRAPH_NO_EXPERTS)
        return
    if routed:  # the worker ranks the layers ahead while this layer's load is served
        asked = ask_rankings(s, layer)
    if s.tr.route_on:
        trace_route(s, t, layer, skip)
    if s.defer_release == 2:
        defer_planned_evictions(s)
    else:  # measured: deferring a layer's own evictions did not win (docs/benchmarks.md)
        drop_planned_evictions(s, True)
    s.pw_layer = -1
    if n_loads > 0 or s.core.n_adopted > 0:
        if not queue_loads(s, layer):
            load_and_wait(s, layer)
    if not s.fault:
        if t.ne[1] == 1:
            if s.prefetch_k > 0:
                prefetch_after(s, layer)
            if routed:
                rank_ahead(s, layer, asked)
        elif s.prefill_ahead and 2 * s.core.n_wanted >= s.core.n_expert:
            read_layer_ahead(s, layer)
    if asked and s.fault:
        await_rankings(s)  # its input lives until this callback returns
    s.mgmt_s += (now() - t0) - (s.stall_s - stall0) - (
        (s.r.rank_wait_s - wait0) if asked else (s.r.rank_s - rank0))


# -- the reference path ------------------------------------------------------------------

cdef void reference(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    cdef int64_t i, j
    cdef char * base = <char *> t.data
    cdef bint ok = False
    if t.type != GGML_TYPE_I32:
        graph_fault(s, layer, GRAPH_IDS_TYPE)
        return
    if s.ref_routing and s.r.ready and t.ne[1] == 1:  # the hook may read and rewrite the routing
        s.ref_probs = locate_router(s, t, layer)
        s.ref_t = t
        s.ref_layer = layer
    with gil:
        try:
            ids = [
                (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]
                for j in range(t.ne[1])
                for i in range(t.ne[0])
            ]
            ok = True if (<object> s.hook)(layer, ids, t.ne[1]) else False
        except BaseException:
            ok = False
    s.ref_t = NULL
    s.ref_probs = NULL
    s.r.x = NULL
    if not ok:
        hook_fault(s, layer)


# -- capture -----------------------------------------------------------------------------

cdef void capture(stream_t * s, ggml_tensor * t) noexcept nogil:
    cdef int j, c, use
    cdef ggml_tensor * src
    cdef int known
    for j in range(10):
        src = t.src[j]
        if src == NULL or src.op != GGML_OP_NONE or src.data == NULL or src.name[0] == 0:
            continue
        use = USE_OTHER
        if j == 0 and t.op == GGML_OP_MUL_MAT:
            use = USE_MUL_MAT
        elif j == 0 and t.op == GGML_OP_MUL_MAT_ID:
            use = USE_MUL_MAT_ID
        known = -1
        for c in range(s.n_captured):
            if strncmp(s.captured[c].name, src.name, NAME_LEN) == 0:
                known = c
                break
        if known >= 0:
            s.captured[known].uses |= use
            continue
        if s.n_captured >= MAX_CAPTURE:
            s.capture_overflow = 1
            return
        strncpy(s.captured[s.n_captured].name, src.name, NAME_LEN - 1)
        s.captured[s.n_captured].name[NAME_LEN - 1] = 0
        s.captured[s.n_captured].address = <uintptr_t> src.data
        s.captured[s.n_captured].tensor = src
        s.captured[s.n_captured].uses = use
        s.n_captured += 1


cdef bool stream_callback(ggml_tensor * t, bool ask, void * user_data) noexcept nogil:
    cdef stream_t * s = <stream_t *> user_data
    cdef int layer, p
    if s.mode == C_MODE_CAPTURE:
        if ask:
            capture(s, t)
            return 0
        return 1
    if (s.mode != C_MODE_STREAM and s.mode != C_MODE_REFERENCE) or s.fault:
        return ask == 0  # after a fault the abort callback stops the decode at the next node
    if strncmp(t.name, b"ffn_moe_topk-", TOPK_PREFIX_LEN) != 0:
        if ask and s.pw_layer >= 0 and s.mode == C_MODE_STREAM:
            p = reads_projection(s, t)
            if p >= 0:  # before it computes: its projection, then compute up to it now
                await_projection(s, p)
                return 1
        return ask == 0
    layer = parse_layer(t.name, TOPK_PREFIX_LEN)
    if layer < 0:
        return ask == 0
    if ask:
        return 1
    if t.ne[1] == 0:  # the last layer of a batch that wants no logits routes no token
        return 1
    if s.tr.route_on or s.tr.io_on:
        trace_ubatch(s, t, layer)
    if s.mode == C_MODE_STREAM:
        demand(s, t, layer)
    else:
        reference(s, t, layer)
    return 1


# -- memory helpers (Python-callable) -----------------------------------------------------

def overlay_anonymous(uintptr_t address, size_t length):
    """Replace ``[address, address + length)`` (page aligned) with fresh anonymous memory."""
    if address % PAGE or length % PAGE:
        raise ValueError("overlay range must be page aligned")
    cdef void * r = mmap(<void *> address, length, PROT_READ | PROT_WRITE,
                         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if r == MAP_FAILED or <uintptr_t> r != address:
        raise OSError(errno, f"mmap overlay failed: {strerror(errno).decode()}")


def advise_hugepages(uintptr_t address, size_t length, bint on):
    """``MADV_HUGEPAGE`` (on) or ``MADV_NOHUGEPAGE`` (off) over the whole pages of a range.

    Dense weights want huge pages (fewer TLB misses: the page cache's large folios gave the
    file mapping that advantage); expert slices must not get them, or the first read of one
    slice would commit a whole 2 MiB page of its neighbours. Best effort: a kernel without
    transparent huge pages just ignores it.
    """
    cdef uintptr_t p0 = (address + PAGE - 1) & ~(<uintptr_t> (PAGE - 1))
    cdef uintptr_t p1 = (address + length) & ~(<uintptr_t> (PAGE - 1))
    if p1 > p0:
        madvise(<void *> p0, p1 - p0, MADV_HUGEPAGE if on else MADV_NOHUGEPAGE)


def give_back(uintptr_t address, int64_t length) -> int:
    """Give back the pages lying wholly inside ``[address, address + length)`` of the
    overlay (memory nothing reads any more: a dense weight moved to a repacked buffer);
    returns the bytes given back. Pages shared with a neighbour stay."""
    cdef uintptr_t p0 = (address + PAGE - 1) & ~(<uintptr_t> (PAGE - 1))
    cdef uintptr_t p1 = (address + length) & ~(<uintptr_t> (PAGE - 1))
    if p1 <= p0:
        return 0
    if madvise(<void *> p0, p1 - p0, MADV_DONTNEED) != 0:
        raise OSError(errno, f"madvise: {strerror(errno).decode()}")
    return p1 - p0


def fill_from_file(int fd, int64_t offset, uintptr_t address, int64_t length):
    """Copy ``length`` bytes of the file at ``offset`` to ``address`` (buffered reads)."""
    cdef int64_t done = 0
    cdef long r
    with nogil:
        while done < length:
            r = pread(fd, <char *> address + done, length - done, offset + done)
            if r < 0 and errno == EINTR:
                continue
            if r <= 0:
                break
            done += r
    if done < length:
        raise OSError(errno or EIO, f"short read filling {length} bytes at offset {offset}")


def drop_file_cache(int fd):
    """Ask the kernel to drop the file's pages from the page cache."""
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)


def o_direct_flag() -> int:
    return O_DIRECT


cdef class ExpertStreamer:
    """Owns the streaming state; keep it alive as long as the context that calls it.

    ``fault_flag_address``: the int the context's abort callback polls for faults
    (``AbortFlag.fault_address``); 0 for none (tests of the mechanism alone).
    """

    cdef stream_t * s
    cdef object _hook

    def __cinit__(self, *, int n_layer, int n_expert, int n_proj, uintptr_t fault_flag_address=0):
        cdef stream_t * s
        cdef int i
        if n_layer <= 0 or n_expert <= 0 or not 0 < n_proj <= 4:
            raise ValueError("n_layer and n_expert must be positive, n_proj in 1..4")
        self.s = <stream_t *> calloc(1, sizeof(stream_t))
        if self.s == NULL:
            raise MemoryError()
        s = self.s
        s.n_proj = n_proj
        s.core = core_new(n_layer, n_expert)
        s.projs = <proj_t *> calloc(n_layer * n_proj, sizeof(proj_t))
        s.captured = <capture_t *> calloc(MAX_CAPTURE, sizeof(capture_t))
        s.io_state = <uint8_t *> calloc(n_layer * n_expert, 1)
        s.stall_layer = <double *> calloc(n_layer, sizeof(double))
        s.recycled_mark = <uint8_t *> calloc(n_layer * n_expert, 1)
        s.recycle = 1
        s.proj_ready = <uint8_t *> calloc(n_layer * n_expert, 1)
        s.pw_ids = <int32_t *> calloc(n_expert, sizeof(int32_t))
        s.pw_layer = -1
        s.proj_waits = 1
        for i in range(n_proj):
            s.proj_order[i] = i
            s.proj_order_packed |= i << (4 * i)
        s.last_route = <int32_t *> calloc(n_layer * n_expert, sizeof(int32_t))
        s.last_route_n = <int *> calloc(n_layer, sizeof(int))
        s.lanes.queue_cap = 4 * n_layer * n_expert + 16
        s.lanes.queue = <int32_t *> calloc(s.lanes.queue_cap, sizeof(int32_t))
        s.lanes.rel_cap = 2 * n_layer * n_expert + 16
        s.lanes.rel = <int32_t *> calloc(s.lanes.rel_cap, sizeof(int32_t))
        s.r.gate_w = <const float **> calloc(n_layer, sizeof(float *))
        s.r.gate_b = <const float **> calloc(n_layer, sizeof(float *))
        s.r.sel_b = <const float **> calloc(n_layer, sizeof(float *))
        s.r.subst_l = -1.0
        s.defer_release = 1
        s.r.use_worker = 1
        s.orphan_reads = 1
        s.r.spec_max = 2
        s.r.last_layer = 1 << 30
        s.tr.last_layer = 1 << 30
        if (s.core == NULL or s.projs == NULL or s.captured == NULL or s.io_state == NULL
                or s.last_route == NULL or s.last_route_n == NULL or s.lanes.queue == NULL
                or s.lanes.rel == NULL or s.stall_layer == NULL or s.recycled_mark == NULL
                or s.proj_ready == NULL or s.pw_ids == NULL
                or s.r.gate_w == NULL or s.r.gate_b == NULL or s.r.sel_b == NULL):
            raise MemoryError()
        s.fault_flag = <int *> fault_flag_address
        self._hook = None

    def __dealloc__(self):
        if self.s == NULL:
            return
        self._release_files()
        core_free(self.s.core)
        free(self.s.projs)
        free(self.s.captured)
        free(self.s.io_state)
        free(self.s.stall_layer)
        free(self.s.recycled_mark)
        free(self.s.proj_ready)
        free(self.s.pw_ids)
        free(self.s.last_route)
        free(self.s.last_route_n)
        free(self.s.lanes.queue)
        free(self.s.lanes.rel)
        self._free_routing()
        self._free_traces()
        free(self.s.r.gate_w)
        free(self.s.r.gate_b)
        free(self.s.r.sel_b)
        free(self.s)
        self.s = NULL

    cdef void _free_traces(self):
        cdef trace_t * tr = &self.s.tr
        tr.route_on = 0
        tr.io_on = 0
        free(tr.ub_tokens)
        free(tr.route)
        free(tr.io)
        free(tr.spec_entry)
        free(tr.status)
        tr.ub_tokens = NULL
        tr.route = NULL
        tr.io = NULL
        tr.spec_entry = NULL
        tr.status = NULL
        tr.ub_n = tr.ub_cap = tr.route_n = tr.route_cap = tr.io_n = tr.io_cap = tr.io_lost = 0

    cdef void _free_routing(self):
        cdef routing_t * r = &self.s.r
        stop_rank_worker(self.s)
        r.ready = 0
        free(r.ranked)
        free(r.ranked_w)
        free(r.ranked_token)
        free(r.logits)
        free(r.sel)
        free(r.vals)
        free(r.flags)
        free(r.taken)
        free(r.ids)
        free(r.ids2)
        free(r.w)
        free(r.dropped)
        free(r.pred_slots)
        free(r.pred_agree)
        r.ranked = NULL
        r.ranked_w = NULL
        r.ranked_token = NULL
        r.logits = NULL
        r.sel = NULL
        r.vals = NULL
        r.flags = NULL
        r.taken = NULL
        r.ids = NULL
        r.ids2 = NULL
        r.w = NULL
        r.dropped = NULL
        r.pred_slots = NULL
        r.pred_agree = NULL

    cdef void _release_files(self):
        cdef int i
        cdef stream_t * s = self.s
        with nogil:
            stop_lanes(s)
        free(s.lanes.threads)
        s.lanes.threads = NULL
        free(s.worker_args)
        s.worker_args = NULL
        if s.fds != NULL:
            for i in range(s.n_files):
                if s.fds[i] >= 0:
                    c_close(s.fds[i])
            free(s.fds)
            s.fds = NULL
            s.n_files = 0
        if s.bounce != NULL:
            for i in range(s.n_lanes):
                free(s.bounce[i])
            free(s.bounce)
            s.bounce = NULL
        free(s.lane_tensor)
        s.lane_tensor = NULL

    def close(self):
        """Stop serving (the callback does nothing from now on) and close the files and
        buffers now, not when the garbage collector runs. The cache's bookkeeping stays
        readable. Only between decodes. Idempotent."""
        self.s.mode = C_MODE_OFF
        stop_rank_worker(self.s)
        self._release_files()
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
    def prefetch_k(self) -> int:
        return self.s.prefetch_k

    @prefetch_k.setter
    def prefetch_k(self, int k):
        """Read ahead the next ``k`` MoE layers' experts as the previous decode token routed
        them (0: off). Between decodes only."""
        if k < 0:
            raise ValueError("prefetch depth must be >= 0")
        self.s.prefetch_k = k

    @property
    def prefill_ahead(self) -> bool:
        return self.s.prefill_ahead != 0

    @prefill_ahead.setter
    def prefill_ahead(self, bint on):
        """In a prefill batch that routes to at least half of a layer's experts, read the
        whole next layer ahead. Between decodes only."""
        self.s.prefill_ahead = 1 if on else 0

    # -- decode routing (prediction, route-ahead, dropping, substitution) -------------------

    def set_router(self, int n_embd, int k, int gating):
        """Make the routing policies possible: the router input's width, the experts per
        token and llama.cpp's gating function (1 softmax, 2 sigmoid, 3 softmax over the
        selected logits, 4 sqrt(softplus)). Then give each MoE layer's router with
        ``set_gate``. Between decodes only."""
        cdef routing_t * r = &self.s.r
        cdef int n_layer = self.s.core.n_layer
        cdef int n = self.s.core.n_expert
        cdef int i
        if n_embd <= 0 or not 0 < k <= n or gating not in (1, 2, 3, 4):
            raise ValueError("need n_embd > 0, 0 < k <= n_expert and a gating function in 1..4")
        self._free_routing()
        r.n_embd = n_embd
        r.k = k
        r.gating = gating
        r.ranked = <int32_t *> calloc(n_layer * k, sizeof(int32_t))
        r.ranked_w = <double *> calloc(n_layer * k, sizeof(double))
        r.ranked_token = <int64_t *> calloc(n_layer, sizeof(int64_t))
        r.logits = <float *> calloc(n, sizeof(float))
        r.sel = <float *> calloc(n, sizeof(float))
        r.vals = <float *> calloc(n, sizeof(float))
        r.flags = <uint8_t *> calloc(n, 1)
        r.taken = <uint8_t *> calloc(n, 1)
        r.ids = <int32_t *> calloc(n, sizeof(int32_t))
        r.ids2 = <int32_t *> calloc(n, sizeof(int32_t))
        r.w = <double *> calloc(n, sizeof(double))
        r.dropped = <uint8_t *> calloc(n, 1)
        r.pred_slots = <int64_t *> calloc(n_layer, sizeof(int64_t))
        r.pred_agree = <int64_t *> calloc(n_layer, sizeof(int64_t))
        if (r.ranked == NULL or r.ranked_w == NULL or r.ranked_token == NULL or r.logits == NULL
                or r.sel == NULL or r.vals == NULL or r.flags == NULL or r.taken == NULL
                or r.ids == NULL or r.ids2 == NULL or r.w == NULL or r.dropped == NULL
                or r.pred_slots == NULL or r.pred_agree == NULL):
            self._free_routing()
            raise MemoryError()
        for i in range(n_layer):
            r.ranked_token[i] = -1
        r.ready = 1

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

    def configure_routing(self, *, int predict=0, int spec_max=2, int route_ahead=0,
                          double drop_cold=0.0, substitute=None):
        """``predict``: bit 1 logs the stale gate's agreement, bit 2 reads its predicted
        misses ahead (at most ``spec_max`` per layer); ``route_ahead`` N > 0 commits each
        decode layer to the ranking made N MoE layers earlier; ``drop_cold`` F > 0 drops
        cold misses below F / k; ``substitute`` L (None: off) replaces a miss by a resident
        expert within L. Between decodes only."""
        if (predict or route_ahead) and not self.s.r.ready:
            raise ValueError("set_router first")
        if predict < 0 or predict > 3 or spec_max < 1 or route_ahead < 0 or drop_cold < 0:
            raise ValueError("invalid routing settings")
        if substitute is not None and substitute < 0:
            raise ValueError("the substitution margin must be >= 0")
        if (drop_cold > 0 or substitute is not None) and not self.s.r.ready:
            raise ValueError("set_router first")
        self.s.r.predict = predict
        self.s.r.spec_max = spec_max
        self.s.r.route_ahead = route_ahead
        self.s.r.drop_f = drop_cold
        self.s.r.subst_l = -1.0 if substitute is None else substitute
        if (predict or route_ahead) and self.s.r.use_worker:
            if start_rank_worker(self.s) != 0:
                self.s.r.use_worker = 0  # rank on the eval thread, as without a worker

    @property
    def rank_worker(self) -> bool:
        """Whether the rankings are made on a worker thread while the eval thread serves the
        layer's load (the decisions are the same either way). Between decodes only."""
        return self.s.r.use_worker != 0

    @rank_worker.setter
    def rank_worker(self, bint on):
        self.s.r.use_worker = 1 if on else 0
        if not on:
            stop_rank_worker(self.s)
        elif (self.s.r.predict or self.s.r.route_ahead) and start_rank_worker(self.s) != 0:
            self.s.r.use_worker = 0

    def routing_stats(self):
        """The routing policies' counters (cumulative)."""
        cdef routing_t * r = &self.s.r
        cdef int n_layer = self.s.core.n_layer
        return {
            "predict_slots": [r.pred_slots[i] for i in range(n_layer)] if r.ready else [],
            "predict_agree": [r.pred_agree[i] for i in range(n_layer)] if r.ready else [],
            "route_ahead_committed": r.ra_committed,
            "route_ahead_passed": r.ra_passed,
            "route_ahead_slots": r.ra_slots,
            "route_ahead_agree": r.ra_agree,
            "decode_slots": r.decode_slots,
            "dropped": r.n_dropped,
            "substituted": r.n_substituted,
            "watchdog_checks": r.checks,
            "watchdog_trips": r.trips,
            "watchdog_trip": (r.trip_token, r.trip_layer, r.trip_agree) if r.trips else None,
            "disarmed": r.disarmed != 0,
            "rank_s": r.rank_s,
            "issue_s": r.issue_s,
            "rank_wait_s": r.rank_wait_s,
            "rank_worker": r.w_started != 0 and r.use_worker != 0,
        }

    # -- traces (--route-trace, --io-trace) ----------------------------------------------

    def enable_traces(self, *, bint route=False, bint io=False, int64_t io_capacity=1 << 20):
        """Record every layer call's routing (``route``) and every projection read (``io``,
        at most ``io_capacity`` reads between two drains; more are counted lost). Between
        decodes only; ``drain_traces`` after each request."""
        cdef trace_t * tr = &self.s.tr
        cdef int64_t n = <int64_t> self.s.core.n_layer * self.s.core.n_expert
        if io_capacity < 1:
            raise ValueError("io_capacity must be >= 1")
        self._free_traces()
        tr.spec_entry = <uint8_t *> calloc(n, 1)
        tr.status = <uint8_t *> calloc(self.s.core.n_expert, 1)
        if io:
            tr.io = <io_rec_t *> calloc(io_capacity, sizeof(io_rec_t))
            tr.io_cap = io_capacity
        if tr.spec_entry == NULL or tr.status == NULL or (io and tr.io == NULL):
            self._free_traces()
            raise MemoryError()
        tr.route_on = 1 if route else 0
        tr.io_on = 1 if io else 0

    def drain_traces(self):
        """The rows recorded since the last drain (then forgotten), once no read is running:
        ``{"ubatches": [(number, n_tokens)], "route": [(ubatch, token, layer, slot, expert,
        weight, residency, dropped)], "io": [(ubatch, layer, proj, expert, lane, spec,
        offset, req_bytes, read_bytes, latency_ns)], "io_lost": n}``."""
        cdef trace_t * tr = &self.s.tr
        cdef int64_t i, n_io
        cdef route_rec_t * r
        cdef io_rec_t * o
        if self.s.lanes.started:
            with nogil:
                pthread_mutex_lock(&self.s.lanes.mu)
                while tr.active_reads > 0:
                    pthread_cond_wait(&self.s.lanes.done, &self.s.lanes.mu)
        try:
            ubatches = [(tr.ub_first + i, tr.ub_tokens[i]) for i in range(tr.ub_n)]
            route = []
            for i in range(tr.route_n):
                r = &tr.route[i]
                route.append((r.ubatch, r.token, r.layer, r.slot, r.expert, r.weight, r.residency, r.dropped))
            n_io = min(tr.io_n, tr.io_cap)
            io = []
            for i in range(n_io):
                o = &tr.io[i]
                io.append((o.ubatch, o.layer, o.proj, o.expert, o.lane, o.spec, o.offset, o.req_bytes,
                           o.read_bytes, o.latency_ns))
            lost = tr.io_lost
            tr.ub_n = 0
            tr.route_n = 0
            tr.io_n = 0
            tr.io_lost = 0
        finally:
            if self.s.lanes.started:
                pthread_mutex_unlock(&self.s.lanes.mu)
        return {"ubatches": ubatches, "route": route, "io": io, "io_lost": lost}

    def set_reference_hook(self, hook):
        """``hook(layer, ids) -> bool`` serves a layer in ``MODE_REFERENCE``: True once
        every routed expert is in memory; False (or an exception) faults the streamer."""
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

    cdef int _call_k(self) except -1:
        if self.s.ref_t == NULL:
            raise ValueError("only inside the reference hook of a decode token's layer call")
        if not 0 < self.s.ref_t.ne[0] <= self.s.core.n_expert:  # the scratch holds n_expert slots
            raise ValueError(f"a top-{self.s.ref_t.ne[0]} of {self.s.core.n_expert} experts")
        return <int> self.s.ref_t.ne[0]

    def call_probs(self):
        """The router's probabilities of the layer call being served, or None."""
        cdef int e
        self._call_k()
        if self.s.ref_probs == NULL:
            return None
        return [self.s.ref_probs[e] for e in range(self.s.core.n_expert)]

    def call_has_input(self) -> bool:
        """Whether the router's input of the layer call being served could be read."""
        self._call_k()
        return self.s.r.x != NULL

    def call_router(self, int layer):
        """Evaluate ``layer``'s router on the input of the layer call being served, with the
        fast path's kernel (``router_scores``): ``(selection, values)``, the scores top-k
        ranks and the values the weights are made of (the logits for the softmax gatings,
        else the gated probabilities, as ``make_ranking`` takes them)."""
        cdef routing_t * r = &self.s.r
        cdef int e, n = self.s.core.n_expert
        self._call_k()
        if r.x == NULL:
            raise ValueError("the router input of this layer call cannot be read")
        if not 0 <= layer < self.s.core.n_layer or r.gate_w[layer] == NULL:
            raise ValueError(f"no router known for layer {layer}")
        router_scores(self.s, layer, r.x)
        selection = [r.sel[e] for e in range(n)]
        if r.gating == 1 or r.gating == 3:
            values = [r.logits[e] for e in range(n)]
        else:
            values = [<float> gate_value(r.gating, r.logits[e]) for e in range(n)]
        return selection, values

    def call_write_ids(self, ids):
        """Rewrite the selection of the layer call being served (before the graph uses it)."""
        cdef int i, k = self._call_k()
        cdef routing_t * r = &self.s.r
        if len(ids) != k or any(not 0 <= e < self.s.core.n_expert for e in ids):
            raise ValueError(f"need {k} expert ids in range")
        for i in range(k):
            r.ids[i] = ids[i]
        write_ids(self.s.ref_t, r.ids, k)

    def call_drop(self, dropped):
        """Drop slots of the layer call being served, as the fast path does: their weights
        zeroed in the router's probabilities and the survivors renormalised
        (``drop_weights``), their missing pages mapped to the zero page."""
        cdef int i, k = self._call_k()
        cdef routing_t * r = &self.s.r
        cdef char * base = <char *> self.s.ref_t.data
        if len(dropped) != k:
            raise ValueError(f"need {k} slots")
        if self.s.ref_probs == NULL:
            raise ValueError("the router's probabilities of this layer call cannot be read")
        for i in range(k):
            r.ids[i] = (<int32_t *> (base + i * self.s.ref_t.nb[0]))[0]
            r.dropped[i] = 1 if dropped[i] else 0
        drop_weights(r, self.s.ref_probs, k)
        for i in range(k):
            if r.dropped[i]:
                map_zero_pages(self.s, self.s.ref_layer, r.ids[i])
            r.dropped[i] = 0

    def captured(self):
        """``{tensor name: address}`` of every weight seen in capture mode."""
        out = {}
        for c in range(self.s.n_captured):
            out[self.s.captured[c].name.decode("utf-8", "replace")] = self.s.captured[c].address
        return out

    def captured_weights(self):
        """``{tensor name: (tensor address, uses)}`` of every weight seen in capture mode;
        ``uses``: 1 the matrix of a ``mul_mat``, 2 of a ``mul_mat_id``, 4 any other operand
        (bits or-ed over every node that reads it)."""
        out = {}
        for c in range(self.s.n_captured):
            name = self.s.captured[c].name.decode("utf-8", "replace")
            out[name] = (<uintptr_t> self.s.captured[c].tensor, self.s.captured[c].uses)
        return out

    def set_projection_repack(self, int layer, int proj, uintptr_t template, uintptr_t tensor_set):
        """From now on, write projection ``proj`` of ``layer`` repacked: through
        ``tensor_set`` (``ggml_backend_tensor_set``) on a copy of ``template`` (one expert's
        shape in llama.cpp's CPU_REPACK buffer type, ``weight_repack.Templates``) pointed at
        the slice. Only between decodes, before anything of the projection is resident."""
        if not (0 <= layer < self.s.core.n_layer and 0 <= proj < self.s.n_proj):
            raise ValueError("layer or projection out of range")
        cdef proj_t * pr = &self.s.projs[layer * self.s.n_proj + proj]
        if pr.base == NULL:
            raise ValueError(f"projection {proj} of layer {layer} is not set")
        if template == 0 or tensor_set == 0:
            raise ValueError("template and tensor_set must be non-null")
        pr.repack = <ggml_tensor *> template
        self.s.tensor_set = <tensor_set_f> tensor_set

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
        if not (0 <= layer < self.s.core.n_layer and 0 <= proj < self.s.n_proj):
            raise ValueError("layer or projection out of range")
        if slice_bytes <= 0 or base == 0:
            raise ValueError("slice_bytes must be positive and base non-null")
        cdef proj_t * pr = &self.s.projs[layer * self.s.n_proj + proj]
        if pr.base != NULL:
            raise ValueError(f"projection {proj} of layer {layer} is already set")
        pr.base = <char *> base
        pr.slice_bytes = slice_bytes
        pr.file_index = file_index
        pr.file_offset = file_offset
        self.s.core.entry_bytes[layer] += slice_bytes

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
        cdef int n = len(paths)
        cdef int i, fd, err
        cdef int64_t biggest = 0
        self.s.fds = <int *> calloc(n, sizeof(int))
        if self.s.fds == NULL:
            raise MemoryError()
        for i in range(n):
            self.s.fds[i] = -1
        self.s.n_files = n
        direct = odirect
        try:
            for i, path in enumerate(paths):
                encoded = str(path).encode()
                fd = -1
                if direct:
                    fd = c_open(encoded, O_RDONLY | O_DIRECT)
                    if fd < 0:
                        direct = False
                if fd < 0:
                    fd = c_open(encoded, O_RDONLY)
                if fd < 0:
                    raise OSError(errno, f"cannot open {path}: {strerror(errno).decode()}")
                self.s.fds[i] = fd
            if not direct:  # one mode for all files: reopen the ones opened direct
                for i, path in enumerate(paths):
                    c_close(self.s.fds[i])
                    self.s.fds[i] = c_open(str(path).encode(), O_RDONLY)
                    if self.s.fds[i] < 0:
                        raise OSError(errno, f"cannot open {path}: {strerror(errno).decode()}")
            self.s.odirect = 1 if direct else 0
            for i in range(self.s.core.n_layer * self.s.n_proj):
                if self.s.projs[i].slice_bytes > biggest:
                    biggest = self.s.projs[i].slice_bytes
            self.s.n_lanes = n_lanes
            self.s.lanes.rel_bound = 2 * n_lanes
            self.s.bounce_size = ((biggest + PAGE - 1) // PAGE + 1) * PAGE
            self.s.bounce = <char **> calloc(n_lanes, sizeof(char *))
            if self.s.bounce == NULL:
                raise MemoryError()
            for i in range(n_lanes):
                if posix_memalign(<void **> &self.s.bounce[i], PAGE, self.s.bounce_size) != 0:
                    raise MemoryError()
            self.s.lane_tensor = <ggml_tensor *> calloc(n_lanes, sizeof(ggml_tensor))
            if self.s.lane_tensor == NULL:
                raise MemoryError()
            self.s.lanes.threads = <pthread_t *> calloc(n_lanes, sizeof(pthread_t))
            self.s.worker_args = <worker_arg_t *> calloc(n_lanes, sizeof(worker_arg_t))
            if self.s.lanes.threads == NULL or self.s.worker_args == NULL:
                raise MemoryError()
            err = start_lanes(self.s)
            if err != 0:
                raise OSError(err, f"cannot start the read lanes: {strerror(err).decode()}")
        except BaseException:
            self._release_files()
            raise
        return True if direct else False

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

    # -- the cache (fast path) -------------------------------------------------------------

    @property
    def recycle(self) -> bool:
        """Whether an evicted entry's pages move under the slices of an entry its plan reads
        (``mremap``, no page given back nor faulted in) instead of going back to the kernel;
        on by default, off for good once the kernel refuses a move. For A/B measurements."""
        return self.s.recycle != 0

    @recycle.setter
    def recycle(self, bint on):
        self.s.recycle = 1 if on else 0

    @property
    def projection_waits(self) -> bool:
        """Whether a layer's expert projections are waited for one by one, by the nodes
        that read them (the compute of one overlaps the reads of the next; on by default,
        where worker lanes run), instead of all at the layer's topk. Between decodes only;
        for A/B measurements."""
        return self.s.proj_waits != 0

    @projection_waits.setter
    def projection_waits(self, bint on):
        self.s.proj_waits = 1 if on else 0

    @property
    def lane_delay_us(self) -> int:
        """Tests only: the worker lanes sleep this many microseconds before each projection
        they read (a slow disk); 0 (the default) in use."""
        return self.s.lane_delay_us

    @lane_delay_us.setter
    def lane_delay_us(self, int us):
        if us < 0:
            raise ValueError("lane_delay_us must be >= 0")
        self.s.lane_delay_us = us

    @property
    def orphan_reads(self) -> bool:
        """Whether a plan's victim whose read still runs is left to its lane (which gives
        its pages back when the read ends) instead of waited for on the eval thread; on by
        default. For A/B measurements."""
        return self.s.orphan_reads != 0

    @orphan_reads.setter
    def orphan_reads(self, bint on):
        self.s.orphan_reads = 1 if on else 0

    @property
    def defer_release(self) -> int:
        """1 (the default): the pages of entries a read ahead evicts are given back later,
        through the release ring, and a layer's own evictions at once; 2: those too through
        the ring; 0: all at once on the eval thread (the behaviour before). For A/B
        measurements."""
        return self.s.defer_release

    @defer_release.setter
    def defer_release(self, int mode):
        if mode not in (0, 1, 2):
            raise ValueError("defer_release is 0, 1 or 2")
        self.s.defer_release = mode

    @property
    def budget_bytes(self) -> int:
        return self.s.core.budget_bytes

    def set_budget(self, int64_t budget_bytes):
        """Change the byte budget between decodes; evicts LRU-first down to it (waiting for
        reads ahead still running on an evicted entry)."""
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        core_set_budget(self.s.core, budget_bytes)
        drop_planned_evictions(self.s, False)
        release_all(self.s)

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

    def stats(self):
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
            "stall_layer_s": [s.stall_layer[i] for i in range(c.n_layer)],
            "mgmt_s": s.mgmt_s,
            "release_s": s.release_s,
            "release_lanes_s": s.release_lanes_s,
            "releases_deferred": s.releases_deferred,
            "releases_cancelled": s.releases_cancelled,
            "evict_waits": s.evict_waits,
            "evict_wait_s": s.evict_wait_s,
            "orphaned": s.orphaned,
            "orphans_cut": s.orphans_cut,
            "projection_waits": s.proj_splits,
            "recycled": s.recycled,
            "recycling": s.recycle != 0,
            "prefetch_issued": c.prefetch_issued,
            "prefetch_hits": c.prefetch_hits,
            "prefetch_wasted": c.prefetch_wasted,
            "resident_bytes": c.resident_bytes,
            "budget_bytes": c.budget_bytes,
            "odirect": s.odirect != 0,
            "lanes": s.n_lanes,
        }

    def fault(self):
        """The first fault (sticky): None, ``("read", file_index, offset, errno)``,
        ``("graph", layer, reason)`` or ``("hook", layer)``."""
        cdef stream_t * s = self.s
        if not s.fault:
            return None
        if s.fault_kind == FAULT_READ:
            return ("read", s.fault_file, s.fault_offset, s.fault_errno)
        if s.fault_kind == FAULT_GRAPH:
            return ("graph", s.fault_layer, _GRAPH_REASONS.get(s.fault_reason, "unknown"))
        return ("hook", s.fault_layer)
