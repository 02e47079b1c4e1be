# Adaptive eviction (included at the end of ``cache_core.pxd``): the ghost cores, fed every
# request after the live core's own decisions, and the rule chooser over their hits, as
# ``bmoe.domain.streaming.ghost_caches`` and ``rule_chooser`` decide.


cdef inline void core_feed_ghost(core_t * g, core_t * c, int layer, int n_tokens, int as_decode) noexcept nogil:
    """Request of ghost ``g`` the ids the live core ``c`` just planned (their first-seen order
    and counts), as the same kind of request."""
    cdef int w
    cdef int32_t e
    core_begin(g)
    for w in range(c.n_wanted):
        e = c.order[w]
        g.wanted[e] = 1
        g.count[e] = c.count[e]
        g.order[w] = e
    g.n_wanted = c.n_wanted
    core_plan_one(g, layer, n_tokens, as_decode)


cdef inline void core_feed_twin(core_t * c, int layer, int n_tokens, int as_decode) noexcept nogil:
    """Request of ``c``'s scope twin (if any, ``cache_twin``) the ids ``c`` just planned, under
    the rule ``c`` has in charge now (the twin's protected segment refitted where it changed)."""
    cdef core_t * g = c.twin
    if g == NULL:
        return
    if g.rule != c.rule:
        g.rule = c.rule
        core_fit_kept(g, core_kept_cap(g))
    core_feed_ghost(g, c, layer, n_tokens, as_decode)

cdef inline void core_choose(core_t * c) noexcept nogil:
    """A window has ended: hand the victim choice to the rule whose ghost hit most in it when
    it leads the rule in charge by more than the margin (as ``RuleChooser.observe``)."""
    cdef int r, leader = c.rule
    for r in range(N_RULES):
        if c.win_hits[r] > c.win_hits[leader]:
            leader = r
    if leader != c.rule and (c.win_hits[leader] - c.win_hits[c.rule]) * 1000 > <int64_t> c.margin_permille * c.win_wanted:
        c.rule = leader
        c.switches += 1
        core_fit_kept(c, core_kept_cap(c))
    c.win_seen = 0
    c.win_wanted = 0
    for r in range(N_RULES):
        c.win_hits[r] = 0


cdef inline int core_plan(core_t * c, int layer, int n_tokens, int as_decode=-1) noexcept nogil:
    """Decide the request (``core_plan_one``); adaptive, then feed it to the ghosts and, for a
    decode request, to the chooser's window; then to the scope twin, if any (``cache_twin``).
    Returns the number of loads, or -1 (nothing
    changed) when the layer has no routed experts."""
    cdef int r
    cdef int n_loads = core_plan_one(c, layer, n_tokens, as_decode)
    cdef bint decode = n_tokens <= 1 if as_decode < 0 else as_decode != 0
    if n_loads < 0:
        return n_loads
    if c.ghost[0] == NULL:
        core_feed_twin(c, layer, n_tokens, as_decode)
        return n_loads
    for r in range(N_RULES):
        core_feed_ghost(c.ghost[r], c, layer, n_tokens, as_decode)
        c.ghost_hits[r] += c.ghost[r].n_hits
    c.ghost_wanted += c.n_wanted
    if decode:
        c.win_seen += 1
        c.win_wanted += c.n_wanted
        for r in range(N_RULES):
            c.win_hits[r] += c.ghost[r].n_hits
        if c.win_seen >= c.window_requests:
            core_choose(c)
    core_feed_twin(c, layer, n_tokens, as_decode)
    return n_loads


cdef inline int core_set_rule(core_t * c, int eviction, int half_life, int window_tokens,
                              int margin_permille) noexcept nogil:
    """Set the eviction at setup (before any request): ``eviction`` a ``RULE_*``, or -1 for
    adaptive (one ghost per rule, sharing this core's entry sizes, budget and ``k``; the
    chooser's window of ``window_tokens`` decode tokens, its ``margin_permille``). Returns 0,
    or -1 when out of memory (then the rule is fixed: the first)."""
    cdef int r, l, n_moe = 0
    cdef core_t * g
    for r in range(N_RULES):
        core_free(c.ghost[r])
        c.ghost[r] = NULL
    c.half_life = half_life
    c.rule = RULE_LFU if eviction < 0 else eviction
    c.counting = eviction < 0 or eviction == RULE_LFU
    heap_rebuild(c)
    if eviction >= 0:
        return 0
    for l in range(c.n_layer):
        if c.entry_bytes[l] > 0:
            n_moe += 1
    c.window_requests = <int64_t> window_tokens * (n_moe if n_moe > 0 else 1)
    c.margin_permille = margin_permille
    for r in range(N_RULES):
        g = core_new(c.n_layer, c.n_expert)
        if g == NULL:
            core_set_rule(c, RULE_LFU, half_life, window_tokens, margin_permille)
            return -1
        free(g.entry_bytes)
        g.entry_bytes = c.entry_bytes
        g.shares_sizes = 1
        g.budget_bytes = c.budget_bytes
        g.n_expert_used = c.n_expert_used
        g.half_life = half_life
        g.rule = r
        g.layer_victims = c.layer_victims
        g.counting = r == RULE_LFU
        c.ghost[r] = g
    return 0
