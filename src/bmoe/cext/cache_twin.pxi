# The scope twin (included by ``cache_core.pxd`` before the ghosts, which feed it: their
# ``core_feed_twin``): under ``--cache-victims auto``, the live core under the other
# victims' scope, as ``bmoe.domain.streaming.scope_twin`` decides.


cdef inline int core_make_twin(core_t * c, int counting) noexcept nogil:
    """Give ``c`` its twin, empty, after ``core_set_rule``: the same entry sizes (shared), budget
    and ``k``, the rule in charge (``counting``: keep use counts, for a rule that may become
    LFU), the other scope. Returns 0, or -1 when out of memory (then no twin)."""
    cdef core_t * g = core_new(c.n_layer, c.n_expert)
    if g == NULL:
        return -1
    free(g.entry_bytes)
    g.entry_bytes = c.entry_bytes
    g.shares_sizes = 1
    g.budget_bytes = c.budget_bytes
    g.n_expert_used = c.n_expert_used
    g.half_life = c.half_life
    g.rule = c.rule
    g.counting = counting
    g.layer_victims = 0 if c.layer_victims else 1
    core_free(c.twin)
    c.twin = g
    return 0


cdef inline void core_set_victims(core_t * c, int layer_victims) noexcept nogil:
    """Set whose entries a miss evicts from the next request on: ``c`` and its ghosts take
    ``layer_victims``, its twin the other scope."""
    cdef int r
    c.layer_victims = layer_victims
    for r in range(N_RULES):
        if c.ghost[r] != NULL:
            c.ghost[r].layer_victims = layer_victims
    if c.twin != NULL:
        c.twin.layer_victims = 0 if layer_victims else 1
