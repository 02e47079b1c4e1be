# Reads ahead of need, on the lanes while llama.cpp computes: ``--prefetch K`` (decode: the
# next K MoE layers as the previous token routed them) and the prefill rule (a batch that
# routed at least half a layer's experts reads the whole next layer), as
# ``bmoe.domain.streaming.prefetch`` and ``ExpertCachePolicy.prefetch`` decide.
#
# Owns: ``last_route*``. Calls: the core (``core_want``), lanes (``prefetch_wanted``). Eval
# thread; no lock of its own.

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
                prefetch_wanted(s, l, False)
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
    prefetch_wanted(s, l, False)
