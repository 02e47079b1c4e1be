# Page memory: the overlay's pages of each expert slice. Eviction gives them back
# (``madvise(MADV_DONTNEED)``, whole pages inside the slice only), hands them to the plan's
# reads (``mremap``: recycling, where ``bmoe.domain.streaming.page_recycling`` allows it) or parks
# them in the release ring, given back later off the read path. A dropped expert's pages
# map to the zero page. Plus the Python-callable helpers that lay the overlay.
#
# Owns: the release ring (``lanes_t.rel*``), ``recycle``, ``recycled_mark``, the
# release and eviction-wait counters. Calls: the core's plan (read only).
# Locks: ``lanes.mu``: ``settle_entry``, ``defer_planned_evictions`` and ``release_all``
# take it; ``release_one``, ``release_locked`` and ``claim_for_read`` are called with it
# held and drop it around ``madvise``.

cdef inline int64_t interior(stream_t * s, int layer, int expert, int p, uintptr_t * p0) noexcept nogil:
    """The whole pages inside one projection slice: their start in ``p0``, their length."""
    cdef proj_t * pr = &s.projs[layer * s.n_proj + p]
    cdef uintptr_t start, end, p1
    p0[0] = 0
    if pr.base == NULL:
        return 0
    start = <uintptr_t> pr.base + <uintptr_t> (row_at(s, layer, expert) * pr.slice_bytes)
    end = start + <uintptr_t> pr.slice_bytes
    p0[0] = (start + PAGE - 1) & ~(<uintptr_t> (PAGE - 1))
    p1 = end & ~(<uintptr_t> (PAGE - 1))
    return <int64_t> (p1 - p0[0]) if p1 > p0[0] else 0


cdef void advise_slices(stream_t * s, int layer, int expert, int advice) noexcept nogil:
    """``madvise(advice)`` over the pages wholly inside each projection slice of one expert."""
    cdef int p
    cdef uintptr_t p0
    cdef int64_t n
    for p in range(s.n_proj):
        n = interior(s, layer, expert, p, &p0)
        if n > 0:
            madvise(<void *> p0, n, advice)


cdef void drop_pages(stream_t * s, int layer, int expert) noexcept nogil:
    """Give back the pages wholly inside each projection slice of one expert."""
    advise_slices(s, layer, expert, MADV_DONTNEED)


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


cdef void swap_planned(stream_t * s) noexcept nogil:
    """Rows (``rows.pxi``): each victim of the plan hands its row to a load of its own layer,
    marking both (the victim 1, handled; the load 3, taken: ``recycle_planned`` clears it)."""
    cdef int m, j
    cdef int32_t v, t
    for m in range(s.core.n_evictions):
        v = s.core.plan_evictions[m]
        if s.recycled_mark[v]:
            continue  # orphaned
        for j in range(s.core.n_loads):
            t = s.core.plan_loads[j]
            if s.recycled_mark[t] == 0 and swap_rows(s, v, t):
                s.recycled_mark[v] = 1
                s.recycled_mark[t] = 3
                break


cdef void recycle_planned(stream_t * s) noexcept nogil:
    """Hand the plan's evicted entries' rows to its loads of the same layer (rows), then the
    others' pages (moved: recycling), pair by pair, marking the victims handled
    (``recycled_mark`` 1). Victims must be settled; orphans (mark 2) and loads whose orphaned
    read still runs are skipped."""
    cdef int m, j = 0, r
    cdef int32_t v
    if s.row_of != NULL:
        swap_planned(s)
    for m in range(s.core.n_evictions if s.recycle else 0):
        while j < s.core.n_loads and (
            s.io_state[s.core.plan_loads[j]] == IO_ORPHAN or s.recycled_mark[s.core.plan_loads[j]] == 3
        ):
            j += 1  # its orphaned read still runs into its pages, or it took a row: no move there
        if j >= s.core.n_loads:
            break
        v = s.core.plan_evictions[m]
        if s.recycled_mark[v]:
            continue  # orphaned, or handed its row
        r = move_pages(s, v, s.core.plan_loads[j])
        if r == 0:
            continue
        s.recycled_mark[v] = 1
        if r < 0:
            s.recycle = 0
            break
        s.recycled += 1
        j += 1
    if s.row_of != NULL:
        for j in range(s.core.n_loads):
            if s.recycled_mark[s.core.plan_loads[j]] == 3:
                s.recycled_mark[s.core.plan_loads[j]] = 0


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


cdef void map_zero_pages(stream_t * s, int layer, int expert) noexcept nogil:
    """A dropped expert is not read, but the graph still multiplies its (absent) slices by a
    zero weight: map its missing pages to the kernel's zero page in one call each
    (``MADV_POPULATE_READ``, Linux 5.14+; ignored where unknown) instead of letting the
    compute threads fault them in one page at a time. The bytes are the same zeros."""
    advise_slices(s, layer, expert, MADV_POPULATE_READ_FLAG)



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
    """Give back the pages lying wholly inside ``[address, address + length)`` (memory
    nothing reads any more: a dense weight of the overlay moved to a repacked buffer, or
    llama.cpp's compute buffer between decodes); returns the bytes given back. Pages shared
    with a neighbour stay."""
    cdef uintptr_t p0 = (address + PAGE - 1) & ~(<uintptr_t> (PAGE - 1))
    cdef uintptr_t p1 = (address + length) & ~(<uintptr_t> (PAGE - 1))
    if p1 <= p0:
        return 0
    if madvise(<void *> p0, p1 - p0, MADV_DONTNEED) != 0:
        raise OSError(errno, f"madvise: {strerror(errno).decode()}")
    return p1 - p0
