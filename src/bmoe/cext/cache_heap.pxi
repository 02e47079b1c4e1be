# The LFU victim's heap (included into ``cache_core.pxd``, after ``core_t``): while the core
# keeps use counts, every resident entry sits in a binary min-heap keyed by (uses, segment,
# label); the least key is the policy's LFU victim, ties and all (``cache_core.pxd`` says why
# the labels follow the list's order). Each function keeps ``heap``/``hpos`` in step; the
# list's link functions call ``heap_keyed`` when they set a label.


cdef inline bint heap_less(core_t * c, int32_t a, int32_t b) noexcept nogil:
    """Entry ``a`` goes before ``b``: fewer uses; among equals probation first; then the list's
    order within the segment (the label)."""
    if c.uses[a] != c.uses[b]:
        return c.uses[a] < c.uses[b]
    if c.kept[a] != c.kept[b]:
        return c.kept[a] < c.kept[b]
    return c.label[a] < c.label[b]


cdef inline void heap_set(core_t * c, int32_t at, int32_t i) noexcept nogil:
    c.heap[at] = i
    c.hpos[i] = at


cdef inline void heap_sink(core_t * c, int32_t i) noexcept nogil:
    """Move entry ``i`` down below the entries of its subtree that go before it."""
    cdef int32_t at = c.hpos[i], child
    while True:
        child = 2 * at + 1
        if child >= c.n_heap:
            break
        if child + 1 < c.n_heap and heap_less(c, c.heap[child + 1], c.heap[child]):
            child += 1
        if not heap_less(c, c.heap[child], i):
            break
        heap_set(c, at, c.heap[child])
        at = child
    heap_set(c, at, i)


cdef inline void heap_fix(core_t * c, int32_t i) noexcept nogil:
    """Restore the heap's order around entry ``i`` (in the heap) after its key changed."""
    cdef int32_t at = c.hpos[i], up
    while at > 0:
        up = (at - 1) >> 1
        if not heap_less(c, i, c.heap[up]):
            break
        heap_set(c, at, c.heap[up])
        at = up
    heap_set(c, at, i)
    heap_sink(c, i)


cdef inline void heap_push(core_t * c, int32_t i) noexcept nogil:
    heap_set(c, c.n_heap, i)
    c.n_heap += 1
    heap_fix(c, i)


cdef inline void heap_remove(core_t * c, int32_t i) noexcept nogil:
    cdef int32_t at = c.hpos[i], last
    if at < 0:
        return
    c.n_heap -= 1
    last = c.heap[c.n_heap]
    c.hpos[i] = -1
    if last != i:
        heap_set(c, at, last)
        heap_fix(c, last)


cdef inline void heap_keyed(core_t * c, int32_t i) noexcept nogil:
    """Entry ``i``'s key changed (or it became resident): fix its place (counting only)."""
    if not c.counting:
        return
    if c.hpos[i] >= 0:
        heap_fix(c, i)
    else:
        heap_push(c, i)


cdef inline void heap_rebuild(core_t * c) noexcept nogil:
    """Every resident entry in the heap, labelled in the list's order (after the counts
    were halved, or where counting starts)."""
    cdef int32_t i = c.head, at
    cdef int64_t n = 0
    while c.n_heap > 0:
        c.n_heap -= 1
        c.hpos[c.heap[c.n_heap]] = -1
    if not c.counting:
        return
    while i >= 0:
        c.label[i] = n
        n += 1
        heap_set(c, c.n_heap, i)
        c.n_heap += 1
        i = c.next[i]
    c.p_lo = -1
    c.p_hi = n
    c.k_hi = n
    at = c.n_heap // 2 - 1
    while at >= 0:
        heap_sink(c, c.heap[at])
        at -= 1
