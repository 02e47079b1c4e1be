# The graph hook: llama.cpp's eval callback. Capture mode records every weight the graph
# reads; stream mode serves each ``ffn_moe_topk-L`` node (gather the ids, let the cache core
# plan, which follows ``bmoe.domain.streaming.ExpertCachePolicy``; release the evictions;
# read the loads and wait, at the topk or per projection at the nodes that read them);
# reference mode hands the ids to the Python policy instead (the ``reference`` room).
#
# Owns: the projection waits (``pw_*``, ``proj_order*``), ``stall_s``, ``mgmt_s``, the
# routing counts (``routed``), the capture. Calls: every other room. Runs on llama.cpp's
# eval thread only (``copy_routing``: any thread, between decodes or under the session's
# decode lock). Locks: ``lanes.mu`` while it queues and waits for reads.

cdef inline void count_stall(stream_t * s, int layer, double seconds) noexcept nogil:
    """The callback waited ``seconds`` for ``layer``'s reads (pages given back meanwhile
    are not counted: they are ``release_s``)."""
    s.stall_s += seconds
    s.stall_layer[layer] += seconds
    if s.wait_ahead_only:
        s.stall_ahead_s += seconds


cdef void count_routes(stream_t * s, ggml_tensor * t, int layer, int sign=1) noexcept nogil:
    """Add the topk node's ids to ``layer``'s routing counts (every slot, before any
    policy drops or substitutes it; ids out of range are left to the policy's fault);
    ``sign`` -1 takes them back (a call the reference policy passed)."""
    cdef int64_t i, j
    cdef int32_t e
    cdef char * base = <char *> t.data
    cdef int64_t * row = s.routed + <int64_t> layer * s.core.n_expert
    if t.type != GGML_TYPE_I32:
        return
    for j in range(t.ne[1]):
        for i in range(t.ne[0]):
            e = (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]
            if 0 <= e < s.core.n_expert:
                row[e] += sign


cdef void copy_routing(stream_t * s, uint8_t * resident, int64_t * routed) noexcept nogil:
    """Copy the cache core's residency and the routing counts, ``n_layer * n_expert``
    entries each (``layer * n_expert + e``)."""
    cdef int64_t n = <int64_t> s.core.n_layer * s.core.n_expert
    memcpy(resident, s.core.resident, n)
    memcpy(routed, s.routed, n * sizeof(int64_t))


cdef bint is_wanted(stream_t * s, int32_t idx, int layer) noexcept nogil:
    return idx // s.core.n_expert == layer and s.core.wanted[idx % s.core.n_expert] != 0


cdef bint wanted_in_flight(stream_t * s, int layer) noexcept nogil:
    """Whether one of the request's entries still waits for bytes: its read queued, or
    running with a projection not landed yet (a lane marks each projection it lands in
    ``proj_ready``, the last one of the entry included where ``n_proj`` counts a
    projection this model lacks). Under the lanes' mutex: a projection seen landed is seen
    with its bytes. The policy adopts every entry read ahead at its first use, so a plan
    without loads nor adoptions should find none."""
    cdef int w, p
    cdef int32_t idx
    cdef uint8_t state
    cdef int present = 0
    cdef bint found = False
    if s.lanes.started == 0:
        return False
    for p in range(s.n_proj):
        if s.projs[layer * s.n_proj + p].base != NULL:
            present |= 1 << p
    pthread_mutex_lock(&s.lanes.mu)
    for w in range(s.core.n_wanted):
        idx = layer * s.core.n_expert + s.core.order[w]
        state = s.io_state[idx]
        if state == IO_QUEUED or (state == IO_READING and (s.proj_ready[idx] & present) != present):
            found = True
            break
    pthread_mutex_unlock(&s.lanes.mu)
    return found


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
        count_stall(s, layer, now() - t0)
        return
    pthread_mutex_lock(&s.lanes.mu)
    queue_plan_first(s)
    if s.lanes.queue_len > 1:
        wake_lanes(s)
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
    count_stall(s, layer, now() - t0 - spent)


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
    wake_lanes(s)
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
                # a node computed on a device holds the device's addresses: checked on a
                # match only (every node of the graph passes here while a layer is awaited)
                if not (s.pw_done >> p) & 1 and in_host_memory(s, t):
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
    count_stall(s, layer, now() - t0 - spent)



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


cdef void demand(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    cdef int n_loads
    cdef double t0 = now()
    cdef double stall0 = s.stall_s
    cdef double rank0 = s.r.rank_s
    cdef double wait0 = s.r.rank_wait_s
    cdef const uint8_t * skip = NULL
    cdef bint routed = t.ne[1] == 1 and t.type == GGML_TYPE_I32 and routing_on(s) and t != &s.dev_node
    cdef bint asked = False
    cdef bint batched
    if routed and route_decode(s, t, layer) > 0:
        skip = s.r.dropped
    if gather_ids(s, t, layer, skip) < 0:
        return
    batched = 1 < t.ne[1] <= s.decode_rows
    n_loads = core_plan(s.core, layer, <int> t.ne[1], 1 if batched else -1)
    if n_loads < 0:
        graph_fault(s, layer, GRAPH_NO_EXPERTS)
        return
    if routed:  # the worker ranks the layers ahead while this layer's load is served
        observe_plan(s)
        asked = ask_rankings(s, layer)
    if s.tr.route_on:
        trace_route(s, t, layer, skip)
    if s.defer_release == 2:
        defer_planned_evictions(s)
    else:  # measured: deferring a layer's own evictions did not win (docs/benchmarks.md)
        drop_planned_evictions(s, True)
    s.pw_layer = -1
    s.wait_ahead_only = n_loads == 0
    if n_loads > 0 or s.core.n_adopted > 0:
        if not queue_loads(s, layer):
            load_and_wait(s, layer)
    elif wanted_in_flight(s, layer):  # never computed on bytes still arriving
        s.unplanned_waits += 1
        load_and_wait(s, layer)
    if not s.fault:
        if t.ne[1] == 1:
            if s.prefetch_k > 0:
                prefetch_after(s, layer)
            if routed:
                rank_ahead(s, layer, asked)
        elif not batched and s.prefill_ahead and 2 * s.core.n_wanted >= s.core.n_expert:
            read_layer_ahead(s, layer)
    if asked and s.fault:
        await_rankings(s)  # its input lives until this callback returns
    s.mgmt_s += (now() - t0) - (s.stall_s - stall0) - (
        (s.r.rank_wait_s - wait0) if asked else (s.r.rank_s - rank0))



cdef bint reads_idle_locked(stream_t * s, int layer) noexcept nogil:
    """No read of ``layer``'s entries queued or running (``lanes.mu`` held)."""
    cdef int32_t i
    for i in range(layer * s.core.n_expert, (layer + 1) * s.core.n_expert):
        if s.io_state[i] == IO_QUEUED or s.io_state[i] == IO_READING:
            return False
    return True


cdef bint layer_reads_idle(stream_t * s, int layer) noexcept nogil:
    """No read of ``layer``'s entries queued or running (under the lanes' mutex: a read
    that just landed is seen with its bytes)."""
    cdef bint idle
    if s.lanes.started == 0:
        return True
    pthread_mutex_lock(&s.lanes.mu)
    idle = reads_idle_locked(s, layer)
    pthread_mutex_unlock(&s.lanes.mu)
    return idle


cdef void await_layer_reads(stream_t * s, int layer) noexcept nogil:
    """Wait until no read of ``layer``'s entries is queued or running (counted as stall)."""
    cdef int32_t idx
    cdef double t0 = now()
    if s.lanes.started == 0:
        return
    pthread_mutex_lock(&s.lanes.mu)
    while not s.fault and not reads_idle_locked(s, layer):
        if s.lanes.queue_len > 0:  # read what is queued here too (there may be no worker)
            idx = queue_pop(s)
            if idx >= 0:
                read_popped(s, idx, 0)
            continue
        pthread_cond_wait(&s.lanes.done, &s.lanes.mu)
    pthread_mutex_unlock(&s.lanes.mu)
    count_stall(s, layer, now() - t0)


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
        s.captured[s.n_captured].host = in_host_memory(s, src)
        s.n_captured += 1


cdef bool stream_callback(ggml_tensor * t, bool ask, void * user_data) noexcept nogil:
    cdef stream_t * s = <stream_t *> user_data
    cdef int layer, p, rows
    if s.mode == C_MODE_CAPTURE:
        if ask:
            capture(s, t)
            return 0
        return 1
    if s.fault:
        return ask == 0  # after a fault the abort callback stops the decode at the next node
    rows = rows_node(s, t, ask)
    if rows >= 0:
        return rows
    if s.mode != C_MODE_STREAM and s.mode != C_MODE_REFERENCE:
        return ask == 0
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
    if s.layer_elsewhere[layer]:  # its experts are resident on a device: no stop, nothing served
        return ask == 0
    if ask:
        if t.ne[1] == 0:  # the last layer of a batch that wants no logits routes no token
            return 0
        if s.pass_layers and s.mode == C_MODE_STREAM and core_pass_layer(s.core, layer):
            if layer_reads_idle(s, layer):
                return 0  # held whole: nothing to serve, the graph goes on
            s.pass_wait = layer
        s.topk_stops += 1
        return 1
    if s.pass_wait == layer:  # passed, but a read of it still ran: wait for it, serve nothing
        s.pass_wait = -1
        await_layer_reads(s, layer)
        return 1
    if not in_host_memory(s, t):  # the layer's router ran on a device: read its ids back
        t = device_node(s, t, layer)
        if t == NULL:
            return 1
    elif t.buffer != NULL:  # the graph's scratch memory, given back after a long prefill
        s.compute_buffer = t.buffer
    if s.tr.route_on or s.tr.io_on:
        trace_ubatch(s, t, layer)
    count_routes(s, t, layer)
    if s.mode == C_MODE_STREAM:
        demand(s, t, layer)
    elif reference(s, t, layer) == 2:  # passed: the layer held whole, its routing unseen
        count_routes(s, t, layer, -1)
    return 1


cdef ggml_tensor * device_node(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    """A copy of topk node ``t`` whose data are its bytes copied from the device it lives on
    (``ggml_backend_tensor_get``, the strides kept); NULL after a graph fault."""
    cdef size_t n
    cdef char * grown
    if s.tensor_get == NULL or s.nbytes == NULL:
        graph_fault(s, layer, GRAPH_ON_DEVICE)
        return NULL
    n = s.nbytes(t)
    if <int64_t> n > s.dev_copy_cap:
        grown = <char *> realloc(s.dev_copy, n)
        if grown == NULL:
            graph_fault(s, layer, GRAPH_ON_DEVICE)
            return NULL
        s.dev_copy = grown
        s.dev_copy_cap = n
    s.tensor_get(t, s.dev_copy, 0, n)
    s.dev_node = t[0]
    s.dev_node.data = s.dev_copy
    s.device_topk += 1
    return &s.dev_node


cdef object captured_table(stream_t * s, int what):
    """The captured weights in host memory: ``{name: address}`` (``what`` 0) or ``{name:
    (tensor address, uses)}`` (1); ``what`` 2: ``{name: tensor address}`` of those on a
    device."""
    cdef int c
    out = {}
    for c in range(s.n_captured):
        if s.captured[c].host != (what != 2):
            continue
        name = s.captured[c].name.decode("utf-8", "replace")
        if what == 1:
            out[name] = (<uintptr_t> s.captured[c].tensor, s.captured[c].uses)
        elif what == 2:
            out[name] = <uintptr_t> s.captured[c].tensor
        else:
            out[name] = s.captured[c].address
    return out
