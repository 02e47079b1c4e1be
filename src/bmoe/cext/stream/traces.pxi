# Traces (``--route-trace``, ``--io-trace``): rows kept in C, drained by Python between
# requests (``bmoe.adapters.traces`` writes them).
#
# Owns: ``trace_t``. Calls: routing (``find_router``, for the weights), route_policy.
# Locks: none to append (the eval thread appends routing rows; any lane appends an I/O row
# with an atomic index); ``traces_drain`` waits under ``lanes.mu`` until no read runs.

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
            and in_host_memory(s, pn) \
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


cdef void traces_free(stream_t * s) noexcept nogil:
    cdef trace_t * tr = &s.tr
    tr.route_on = 0
    tr.io_on = 0
    free_clear(<void **> &tr.ub_tokens)
    free_clear(<void **> &tr.route)
    free_clear(<void **> &tr.io)
    free_clear(<void **> &tr.spec_entry)
    free_clear(<void **> &tr.status)
    tr.ub_n = tr.ub_cap = tr.route_n = tr.route_cap = tr.io_n = tr.io_cap = tr.io_lost = 0


cdef int traces_enable(stream_t * s, bint route, bint io, int64_t io_capacity) noexcept nogil:
    """Allocate the trace buffers and switch the traces on; -1 (all freed) without memory."""
    cdef trace_t * tr = &s.tr
    cdef int64_t n = <int64_t> s.core.n_layer * s.core.n_expert
    traces_free(s)
    tr.spec_entry = <uint8_t *> calloc(n, 1)
    tr.status = <uint8_t *> calloc(s.core.n_expert, 1)
    if io:
        tr.io = <io_rec_t *> calloc(io_capacity, sizeof(io_rec_t))
        tr.io_cap = io_capacity
    if tr.spec_entry == NULL or tr.status == NULL or (io and tr.io == NULL):
        traces_free(s)
        return -1
    tr.route_on = 1 if route else 0
    tr.io_on = 1 if io else 0
    return 0


cdef object traces_drain(stream_t * s):
    """The rows since the last drain as Python values (then forgotten), once no read runs."""
    cdef trace_t * tr = &s.tr
    cdef int64_t i, n_io
    cdef route_rec_t * r
    cdef io_rec_t * o
    if s.lanes.started:
        with nogil:
            pthread_mutex_lock(&s.lanes.mu)
            while tr.active_reads > 0:
                pthread_cond_wait(&s.lanes.done, &s.lanes.mu)
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
        if s.lanes.started:
            pthread_mutex_unlock(&s.lanes.mu)
    return {"ubatches": ubatches, "route": route, "io": io, "io_lost": lost}
