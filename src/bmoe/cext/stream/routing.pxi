# The decode routing policies' mechanism: router scores on the layer's input (the stale
# gate), rankings of layers ahead, the watchdog, route-ahead's commitment, dropping and
# substitution, and the reads a ranking asks for. The decisions are the domain's
# (``bmoe.domain.streaming.decode_routing``, ``routing``), taken through ``route_policy.pxd``.
#
# Owns: ``routing_t`` but its worker part. Calls: rank_worker (ask, await), pages
# (``map_zero_pages``), lanes (``prefetch_wanted``), the core.
# Locks: none; eval thread, except ``make_ranking``, which the rank worker runs too (on
# targets the eval thread does not touch until ``await_rankings``).

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


cdef int rank_targets(stream_t * s, int layer, int * targets, int * committed) noexcept nogil:
    """The layers a decode layer's router input ranks, in order (at most ``MAX_TARGETS``):
    the next ``predict_depth`` MoE layers, nearest first (prediction: ``committed`` 0), and
    the one N MoE layers on (route-ahead: 1)."""
    cdef routing_t * r = &s.r
    cdef int n = 0, target, depth
    if r.predict and r.gate_open:
        for depth in range(1, r.predict_depth + 1):
            target = moe_layer_ahead(s, layer, depth)
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


cdef void observe_plan(stream_t * s) noexcept nogil:
    """After a decode layer call's plan: its misses and its slots enter the auto gate's
    window of ``AUTO_WINDOW`` calls, and the gate moves (``DecodeRouting.observe``)."""
    cdef routing_t * r = &s.r
    cdef int32_t cold = s.core.n_loads
    cdef int32_t slots = s.core.n_hits + s.core.n_loads
    if r.win_n == AUTO_WINDOW:
        r.win_cold_sum -= r.win_cold[r.win_pos]
        r.win_slots_sum -= r.win_slots[r.win_pos]
    else:
        r.win_n += 1
    r.win_cold[r.win_pos] = cold
    r.win_slots[r.win_pos] = slots
    r.win_cold_sum += cold
    r.win_slots_sum += slots
    r.win_pos = (r.win_pos + 1) % AUTO_WINDOW
    if r.predict_auto and r.predict & 2:
        r.gate_open = 1 if rp_gate_open(r.win_cold_sum, r.win_slots_sum, AUTO_COLD_PCT) else 0
        if r.gate_open:
            r.gate_open_calls += 1
        else:
            r.gate_closed_calls += 1


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
            and xn.data != NULL and in_host_memory(s, xn)):
        s.r.x = <const float *> xn.data
    if (pn != NULL and pn.type == GGML_TYPE_F32 and pn.ne[0] == s.core.n_expert and pn.nb[0] == 4
            and pn.data != NULL and in_host_memory(s, pn)):
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
    prefetch_wanted(s, target, committed)


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
    cdef int targets[MAX_TARGETS]
    cdef int committed[MAX_TARGETS]
    if asked:
        await_rankings(s)
    if r.x == NULL or r.disarmed:
        return
    n = rank_targets(s, layer, targets, committed)
    for j in range(n):  # a guess is read ahead only with --predict-prefetch
        rank_and_issue(s, targets[j], committed[j] or r.predict & 2, committed[j], asked)


cdef void routing_free(stream_t * s) noexcept nogil:
    """Stop the rank worker and free the routing buffers (``set_router`` made them)."""
    cdef routing_t * r = &s.r
    stop_rank_worker(s)
    r.ready = 0
    free_clear(<void **> &r.ranked)
    free_clear(<void **> &r.ranked_w)
    free_clear(<void **> &r.ranked_token)
    free_clear(<void **> &r.logits)
    free_clear(<void **> &r.sel)
    free_clear(<void **> &r.vals)
    free_clear(<void **> &r.flags)
    free_clear(<void **> &r.taken)
    free_clear(<void **> &r.ids)
    free_clear(<void **> &r.ids2)
    free_clear(<void **> &r.w)
    free_clear(<void **> &r.dropped)
    free_clear(<void **> &r.pred_slots)
    free_clear(<void **> &r.pred_agree)


cdef int routing_alloc(stream_t * s, int n_embd, int k, int gating) noexcept nogil:
    """Make the routing buffers for a router of width ``n_embd``, top-``k``, ``gating``;
    -1 (all freed) without memory."""
    cdef routing_t * r = &s.r
    cdef int n_layer = s.core.n_layer
    cdef int n = s.core.n_expert
    cdef int i
    routing_free(s)
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
        routing_free(s)
        return -1
    for i in range(n_layer):
        r.ranked_token[i] = -1
    r.ready = 1
    return 0


cdef object routing_stats(stream_t * s):
    """The routing policies' counters (cumulative), as ``ExpertStreamer.routing_stats``,
    under ``StreamCounters``' field names (and two of the mechanism's own)."""
    cdef routing_t * r = &s.r
    cdef int n_layer = s.core.n_layer
    return {
        "predict_layers": tuple((r.pred_slots[i], r.pred_agree[i]) for i in range(n_layer)) if r.ready else (),
        "route_ahead_committed": r.ra_committed,
        "route_ahead_passed": r.ra_passed,
        "route_ahead_slots": r.ra_slots,
        "route_ahead_agree": r.ra_agree,
        "decode_slots": r.decode_slots,
        "dropped": r.n_dropped,
        "substituted": r.n_substituted,
        "watchdog_checks": r.checks,
        "watchdog_trips": r.trips,
        "predict_gate_open": r.gate_open_calls,
        "predict_gate_closed": r.gate_closed_calls,
        "watchdog_trip": (r.trip_token, r.trip_layer, r.trip_agree) if r.trips else None,
        "disarmed": r.disarmed != 0,
        "rank_s": r.rank_s,
        "issue_s": r.issue_s,
        "rank_wait_s": r.rank_wait_s,
        "rank_worker": r.w_started != 0 and r.use_worker != 0,
    }
