# The reference path: at each ``ffn_moe_topk-L`` node the ids go to a Python hook (the domain
# policies, ``ExpertCachePolicy`` and ``DecodeRouting``, executed through the ports by
# ``bmoe.service.expert_streaming.PolicyStreaming``) instead of the cache core; ``ReferenceCall`` is what that hook may read and
# write of the layer call it serves, with the fast path's own kernels (``router_scores``,
# ``write_ids``, ``drop_weights``), so that both paths compute alike.
#
# Owns: ``ref_*``, the hook. Calls: routing (the router's kernels), pages (zero pages).
# Locks: the GIL around the hook; the eval thread only.

cdef int reference(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    """Hand the layer call to the hook: 1 served, 2 passed (the policy's layer held
    whole: ``pass_layer``), 0 after a fault."""
    cdef int64_t i, j
    cdef char * base = <char *> t.data
    cdef int ok = 0
    if t.type != GGML_TYPE_I32:
        graph_fault(s, layer, GRAPH_IDS_TYPE)
        return 0
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
            served = (<object> s.hook)(layer, ids, t.ne[1])
            ok = 2 if served == 2 else (1 if served else 0)
        except BaseException:
            ok = 0
    s.ref_t = NULL
    s.ref_probs = NULL
    s.r.x = NULL
    if not ok:
        hook_fault(s, layer)
    return ok


cdef class ReferenceCall:
    """The decode layer call the reference hook serves: valid only while the hook runs
    (``ExpertStreamer.reference_call``; the adapter ``StreamerRouterView`` wraps it)."""

    cdef stream_t * s
    cdef object _owner  # the streamer that owns ``s``

    @staticmethod
    cdef ReferenceCall bound(stream_t * s, object owner):
        cdef ReferenceCall call = ReferenceCall.__new__(ReferenceCall)
        call.s = s
        call._owner = owner
        return call

    cdef int _k(self) except -1:
        if self.s.ref_t == NULL:
            raise ValueError("only inside the reference hook of a decode token's layer call")
        if not 0 < self.s.ref_t.ne[0] <= self.s.core.n_expert:  # the scratch holds n_expert slots
            raise ValueError(f"a top-{self.s.ref_t.ne[0]} of {self.s.core.n_expert} experts")
        return <int> self.s.ref_t.ne[0]

    def probs(self):
        """The router's probabilities of the layer call being served, or None."""
        cdef int e
        self._k()
        if self.s.ref_probs == NULL:
            return None
        return [self.s.ref_probs[e] for e in range(self.s.core.n_expert)]

    def has_input(self) -> bool:
        """Whether the router's input of the layer call being served could be read."""
        self._k()
        return self.s.r.x != NULL

    def router(self, int layer):
        """Evaluate ``layer``'s router on the input of the layer call being served, with the
        fast path's kernel (``router_scores``): ``(selection, values)``, the scores top-k
        ranks and the values the weights are made of (the logits for the softmax gatings,
        else the gated probabilities, as ``make_ranking`` takes them)."""
        cdef routing_t * r = &self.s.r
        cdef int e, n = self.s.core.n_expert
        self._k()
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

    def write_ids(self, ids):
        """Rewrite the selection of the layer call being served (before the graph uses it)."""
        cdef int i, k = self._k()
        cdef routing_t * r = &self.s.r
        if len(ids) != k or any(not 0 <= e < self.s.core.n_expert for e in ids):
            raise ValueError(f"need {k} expert ids in range")
        for i in range(k):
            r.ids[i] = ids[i]
        write_ids(self.s.ref_t, r.ids, k)

    def drop(self, dropped):
        """Drop slots of the layer call being served, as the fast path does: their weights
        zeroed in the router's probabilities and the survivors renormalised
        (``drop_weights``), their missing pages mapped to the zero page."""
        cdef int i, k = self._k()
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
