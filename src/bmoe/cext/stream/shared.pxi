# The state every room of the engine shares: the stream's states and limits, the structs
# (one ``stream_t`` per streamer, holding each room's part by value), their allocation
# (``stream_new``, ``stream_free``) and the clock.
#
# Owns: ``stream_t`` itself; the structs say which room owns each field.
# Calls: each room's own teardown from ``stream_free``. Locks: none.
#
# Engine options (``ExpertStreamer.configure``: ``StreamerSettings.engine``, an ``EngineOptions``)
# are the fields marked "option": set once at setup, read by the rooms, never decided.

cdef enum:
    C_MODE_OFF = 0
    C_MODE_CAPTURE = 1
    C_MODE_STREAM = 2
    C_MODE_REFERENCE = 3


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
    MAX_TARGETS = 5        # rankings a decode layer makes: MAX_PREDICT_DEPTH guesses, 1 commitment
    MAX_PREDICT_DEPTH = 4  # decode_routing.MAX_PREDICT_DEPTH

cdef enum:
    AUTO_WINDOW = 64       # the auto gate's decode calls (decode_routing.AUTO_WINDOW)
    AUTO_COLD_PCT = 10     # ... and its share of cold slots (decode_routing.AUTO_COLD_PCT)

cdef enum:
    PAGE = 4096
    MAX_CAPTURE = 16384
    NAME_LEN = 64
    USE_MUL_MAT = 1        # a weight captured as the matrix of a mul_mat node
    USE_MUL_MAT_ID = 2     # ... of a mul_mat_id node (routed experts)
    USE_OTHER = 4          # ... as any other operand (get_rows, add, mul, ...)


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
    GRAPH_ON_DEVICE = 4
    GRAPH_ROWS = 5


cdef struct proj_t:
    char * base            # address of expert 0 (NULL: this layer has no such projection)
    int64_t slice_bytes    # nb[2]
    int file_index
    int64_t file_offset    # of expert 0
    ggml_tensor * repack   # one expert's shape in llama.cpp's CPU_REPACK buffer type, with
                           # its traits (weight_repack.Templates); NULL: the file's layout


ctypedef void (*tensor_set_f)(ggml_tensor *, const void *, size_t, size_t) noexcept nogil
ctypedef void (*tensor_get_f)(const ggml_tensor *, void *, size_t, size_t) noexcept nogil
# ggml's C ``bool``, not Cython's ``bint`` (an int): a ``bool`` is returned in the low byte
# of ``eax`` alone, and a clang-built ggml leaves the upper bytes as they were (0x7f603701
# seen for ``true``, and a ``false`` may read as non-zero), where gcc happens to clear them
ctypedef bool (*buffer_is_host_f)(void *) noexcept nogil
ctypedef size_t (*nbytes_f)(const ggml_tensor *) noexcept nogil


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
    int host               # in host memory (else on a device: neither streamed nor repacked)


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
    int predict_auto               # with bit 2: predict and read only while the auto gate is open
    int gate_open                  # the auto gate now (1 without predict_auto)
    int32_t win_cold[AUTO_WINDOW]  # the auto gate's ring of the last AUTO_WINDOW decode calls
    int32_t win_slots[AUTO_WINDOW]
    int win_pos
    int win_n
    int64_t win_cold_sum
    int64_t win_slots_sum
    int64_t gate_open_calls
    int64_t gate_closed_calls
    int spec_max                   # predicted misses read per layer
    int predict_depth              # MoE layers the stale gate guesses ahead, nearest first
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
    int use_worker                 # option: 1 (default) rank on the worker when it runs
    int w_started
    int w_stop
    int w_pending                  # rankings asked and not yet made
    int w_n
    int w_targets[MAX_TARGETS]
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
    int read_in_place              # 1: a projection that lands as read is read into its slice
    int wake_all                   # 1: queued reads wake every worker (BMOE_WAKE_LANES=all)
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
    double stall_ahead_s           # stall_s of layer calls that missed nothing: their wait was for
                                   # reads issued ahead that had not landed (late, not wrong)
    int wait_ahead_only            # the layer call being served missed nothing (its loads: 0)
    int recycle                    # option: hand evicted pages to the plan's reads (mremap); 0 once
                                   # the kernel refused (then pages are released as before)
    uint8_t * recycled_mark        # [n_layer * n_expert]: scratch, this plan's recycled victims
    int64_t recycled               # evicted entries whose pages went to a read
    int defer_release              # option: 1 (default) the pages of entries reads ahead evict go
                                   # back through the release ring; 2: a layer's own
                                   # evictions too; 0: all at once (A/B measurements)
    double release_s               # moving or giving evicted pages back (the eval thread)
    double release_lanes_s         # ... (worker lanes; under the lanes' mutex)
    int64_t releases_deferred      # evictions whose pages went to the release ring
    int64_t releases_cancelled     # ... and were read again before they were released
    int64_t evict_waits            # evicted entries whose running read the eval thread waited for
    double evict_wait_s            # ... and how long
    int orphan_reads               # option: 1 (default) a plan's victim still being read is left to
                                   # its lane (IO_ORPHAN) instead of waited for; 0: waited for
    int64_t orphaned               # victims left to their lane so
    int64_t orphans_cut            # orphaned reads that stopped before their last projection
    long long land_ns              # time landing projections in their slices (memcpy, or llama.cpp's
                                   # repack): CPU work on whichever lane read; any lane, atomically
    long long lane_cpu_ns          # the worker lanes' own CPU time (user + system: the repack, the
                                   # O_DIRECT path in the kernel) while reading: CPU taken from the
                                   # cores the compute threads share; under the lanes' mutex
    long long in_place_bytes       # ... of which read straight into the slices' pages
    long long landed_bytes         # projection bytes read from the files into their slices (the
                                   # plans count a read when planned: one cancelled while queued,
                                   # or cut, never lands); any lane, atomically
    # projection waits: a layer's loads are queued at its topk and each node that reads one
    # of its expert projections waits, when it is asked for, for that projection of the
    # layer's experts only (the compute of one projection overlaps the reads of the next)
    int proj_waits                 # option: 1 (default) on, where worker lanes run; 0: wait at topk
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
    int lane_delay_us              # option, tests only: worker lanes sleep this long before each
                                   # projection (a slow disk), so reads ahead are still
                                   # running when later plans evict them
    # expert rows (``rows.pxi``): entry ``idx``'s bytes live in row ``row_of[idx]`` of its
    # layer's expert tensors; NULL: each in its own (the ids are then never rewritten)
    int32_t * row_of               # [n_layer * n_expert]
    int rows_layer                 # the layer call whose ids are rows now; -1: none
    int rows_shuffled              # option (tests): the rows started as ``shuffled_rows``
    int64_t rows_rewritten         # layer calls whose ids were rewritten to rows
    int64_t rows_swapped           # misses read into their victim's row (no page moved)
    # reads ahead (--prefetch K): the previous decode token's routing of each layer
    int prefetch_k
    int prefill_ahead              # read the whole next layer ahead in a prefill batch
    int decode_rows                # a graph call of at most this many tokens is a decode step
                                   # of that many sequences (one token each): decode, not a scan
    void * compute_buffer          # the ggml_backend_buffer the last graph's topk node lived in
                                   # (llama.cpp's compute buffer; host memory only), NULL before
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
    # devices (a layer's dense part computed on a GPU or an RPC server): ggml's backend
    # functions (set_backend_api; NULL: every tensor is in host memory)
    tensor_get_f tensor_get        # ggml_backend_tensor_get
    buffer_is_host_f buffer_is_host
    nbytes_f nbytes                # ggml_nbytes
    char * dev_copy                # a device topk node's bytes, copied to the host
    int64_t dev_copy_cap
    ggml_tensor dev_node           # that node, pointed at dev_copy
    uint8_t * layer_elsewhere      # [n_layer]: its experts are resident on a device: not served,
                                   # and the graph does not stop at its topk
    int64_t topk_stops             # topk nodes the graph stopped at for the callback
    int64_t unplanned_waits        # layer calls whose plan read nothing and adopted nothing
                                   # yet routed to an entry whose read was in flight: waited
                                   # for all the same (the policy should have adopted it: 0)
    int pass_layers                # option: a layer the cache holds whole is passed (the core's
                                   # pass_layer): no request, and no stop where no read of it runs
    int pass_wait                  # a passed layer whose reads still ran at its ask: waited for
                                   # at its topk (-1: none)
    int64_t device_topk            # topk nodes read from a device
    # routing counts (the hook, both modes): how many routed slots chose each entry since
    # setup; read by ``expert_snapshot`` (never reset: readers take differences)
    int64_t * routed               # [n_layer * n_expert]


cdef inline double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline long long thread_cpu_ns() noexcept nogil:
    """This thread's CPU time (user + system) in nanoseconds."""
    cdef timespec ts
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return ts.tv_sec * 1000000000LL + ts.tv_nsec


cdef inline long long now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000LL + ts.tv_nsec


cdef inline void free_clear(void ** p) noexcept nogil:
    """``free(*p)``, then ``*p = NULL``."""
    free(p[0])
    p[0] = NULL


cdef stream_t * stream_new(int n_layer, int n_expert, int n_proj, int * fault_flag) noexcept nogil:
    """A zeroed stream with every per-entry array allocated and the engine options at their
    defaults; NULL (nothing left allocated) without memory."""
    cdef int i
    cdef stream_t * s = <stream_t *> calloc(1, sizeof(stream_t))
    if s == NULL:
        return NULL
    s.n_proj = n_proj
    s.core = core_new(n_layer, n_expert)
    s.projs = <proj_t *> calloc(n_layer * n_proj, sizeof(proj_t))
    s.captured = <capture_t *> calloc(MAX_CAPTURE, sizeof(capture_t))
    s.io_state = <uint8_t *> calloc(n_layer * n_expert, 1)
    s.stall_layer = <double *> calloc(n_layer, sizeof(double))
    s.recycled_mark = <uint8_t *> calloc(n_layer * n_expert, 1)
    s.proj_ready = <uint8_t *> calloc(n_layer * n_expert, 1)
    s.pw_ids = <int32_t *> calloc(n_expert, sizeof(int32_t))
    s.pw_layer = -1
    s.pass_wait = -1
    s.rows_layer = -1
    s.r.gate_open = 1  # no auto gate until configure asks for one
    for i in range(n_proj):
        s.proj_order[i] = i
        s.proj_order_packed |= i << (4 * i)
    s.last_route = <int32_t *> calloc(n_layer * n_expert, sizeof(int32_t))
    s.last_route_n = <int *> calloc(n_layer, sizeof(int))
    s.layer_elsewhere = <uint8_t *> calloc(n_layer, 1)
    s.routed = <int64_t *> calloc(n_layer * n_expert, sizeof(int64_t))
    s.lanes.queue_cap = 4 * n_layer * n_expert + 16
    s.lanes.queue = <int32_t *> calloc(s.lanes.queue_cap, sizeof(int32_t))
    s.lanes.rel_cap = 2 * n_layer * n_expert + 16
    s.lanes.rel = <int32_t *> calloc(s.lanes.rel_cap, sizeof(int32_t))
    s.r.gate_w = <const float **> calloc(n_layer, sizeof(float *))
    s.r.gate_b = <const float **> calloc(n_layer, sizeof(float *))
    s.r.sel_b = <const float **> calloc(n_layer, sizeof(float *))
    s.r.subst_l = -1.0
    s.r.spec_max = 2
    s.r.predict_depth = 1
    s.r.last_layer = 1 << 30
    s.tr.last_layer = 1 << 30
    # the engine options' defaults (configure sets them)
    s.recycle = 1
    s.proj_waits = 1
    s.defer_release = 1
    s.r.use_worker = 1
    s.orphan_reads = 1
    s.fault_flag = fault_flag
    if (s.core == NULL or s.projs == NULL or s.captured == NULL or s.io_state == NULL
            or s.last_route == NULL or s.last_route_n == NULL or s.lanes.queue == NULL
            or s.lanes.rel == NULL or s.stall_layer == NULL or s.recycled_mark == NULL
            or s.proj_ready == NULL or s.pw_ids == NULL or s.layer_elsewhere == NULL
            or s.routed == NULL
            or s.r.gate_w == NULL or s.r.gate_b == NULL or s.r.sel_b == NULL):
        stream_free(s)
        return NULL
    return s


cdef void stream_free(stream_t * s) noexcept nogil:
    """Stop every thread (lanes, rank worker), close the files and free everything."""
    if s == NULL:
        return
    lanes_close(s)
    routing_free(s)
    traces_free(s)
    core_free(s.core)
    free(s.projs)
    free(s.captured)
    free(s.io_state)
    free(s.stall_layer)
    free(s.recycled_mark)
    free(s.proj_ready)
    free(s.pw_ids)
    free(s.last_route)
    free(s.last_route_n)
    free(s.layer_elsewhere)
    free(s.routed)
    free(s.dev_copy)
    free(s.row_of)
    free(s.lanes.queue)
    free(s.lanes.rel)
    free(s.r.gate_w)
    free(s.r.gate_b)
    free(s.r.sel_b)
    free(s)


cdef inline bint in_host_memory(stream_t * s, const ggml_tensor * t) noexcept nogil:
    """Whether ``t.data`` is an address of this process (not a device's). For graph nodes and
    weights as loaded; not for expert tensors once tagged for repacking (a ``CPU_REPACK``
    buffer is host memory but says it is not)."""
    if s.buffer_is_host == NULL or t.buffer == NULL:
        return True
    return s.buffer_is_host(t.buffer) != 0  # exactly 0 or 1: ``host`` is compared with 1
