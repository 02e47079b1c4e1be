# The expert cache's decision core in C: the segmented LRU over (layer, expert) entries with
# a byte budget and per-layer entry sizes. It follows ``bmoe.domain.streaming.cache_policy``
# decision for decision (tests drive both with the same requests and compare every plan
# and counter). Pure bookkeeping: the caller executes the plan (drops the evicted entries'
# pages, reads the loads). Shared by ``expert_stream`` (the engine) and ``cache_core``
# (the same code, callable from Python for the equivalence tests and benchmarks).
#
# A request: ``core_begin``, ``core_want`` for each routed id (duplicates counted, first-seen
# order kept), then ``core_plan``: hits are promoted or touched in wanted order, then (when
# there are misses) entries this layer does not want are evicted from the list's head until
# the misses fit, then the misses become resident in wanted order. A request of several
# tokens that routes more experts than the layer's share of the budget keeps only its
# ``share`` most-routed ones hot: its other hits are not touched and its other loads enter at
# the cold end (scan resistance; the policy's docstring says why). The plan is left in
# ``plan_hits`` / ``plan_evictions`` / ``plan_loads`` (entry indices ``layer * n_expert + e``),
# the hits on entries read ahead (prefetched or warmed) and not routed to before in
# ``plan_adopted``: their reads may still be in flight, the engine waits for them.
#
# Segments: one doubly linked list, the eviction order, probation (oldest first) then the
# protected segment (``kept``, oldest first; ``kept_head`` its first entry, -1 when empty;
# ``kept_bytes`` its size). Loads and reads ahead enter probation: at its most recent end
# (just before ``kept_head``) or at the cold end (the head). A decode request's hit on an entry
# used before (or warmed; not a prefetch's first use) moves it to the tail (the protected
# segment's most recent end); other touches stay in the entry's segment. Past the cap (``core_kept_cap``: the budget less
# ``k`` entries of every MoE layer, ``k`` = ``n_expert_used`` or, when 0, ``k_seen``, the most
# ids one decode request wanted) the protected segment's oldest entry moves to probation's
# most recent end: the same place in the list, so demoting is clearing its flag.
#
# Reads ahead: ``core_begin``, ``core_want`` for each id, then ``core_prefetch``: each id not
# resident enters at the cold end (the list's head) after room is made from the head without
# evicting the last request's entries (``protected``) nor any wanted entry of this prefetch's
# layer; when no room can be made the rest is not issued. ``hot`` (a committed routing):
# wanted residents are touched (in their segment) and the reads enter at probation's most
# recent end instead. The issued entries are left in ``plan_loads``.
#
# Eviction by frequency (``lfu`` set; the policy's ``eviction="lfu"``): ``uses[i]`` counts the
# requests that routed entry ``i`` (resident or not; once per request), halved for every entry
# each ``half_life`` decode tokens (``ticks`` counts decode requests up to ``half_life`` times
# the MoE layers). Every place that evicts from the head instead evicts, one at a time, the
# resident entry with the fewest uses that it may evict, the first in the list's order among
# equals (``core_lfu_victim``). The list and its segments are kept as under SLRU. So that a
# victim costs O(log n), not a walk of the list, every resident entry sits (while ``counting``)
# in a binary min-heap keyed by (uses, segment, ``label``): a label grows at each segment's
# ends as entries are linked there (probation's cold end takes ``--p_lo``, its most recent end
# ``++p_hi``, the protected segment's ``++k_hi``), so within a segment the labels follow the
# list's order, and the heap's least key is the policy's victim, ties and all.
#
# The rule in charge (``rule``, the policy's ``rule``): ``RULE_LRU`` (the protected cap is 0:
# a plain LRU), ``RULE_SLRU``, ``RULE_LFU``; ``counting`` keeps the use counts (lfu, adaptive).
# Adaptive (``ghost[r]`` set, the policy's ``eviction="adaptive"``): one ghost core per rule,
# ids only, sharing the live core's entry sizes, fed every request after the live core's own
# decisions (``core_plan``: the same wanted ids, counts, tokens and decode flag; no reads
# ahead), budget changes and evict-alls; the chooser (``bmoe.domain.streaming.rule_chooser``)
# sums the ghosts' hits over windows of ``window_requests`` decode requests and hands the
# victim choice to the rule that leads the one in charge by more than ``margin_permille``
# thousandths of the window's wanted entries (ties keep it; the first rule among others).

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

# what ``prefetched`` holds for an entry read ahead and not routed to since (0: none)
cdef enum:
    AHEAD_PREFETCH = 1
    AHEAD_WARM = 2

# the eviction rules, in ``bmoe.domain.streaming.ghost_caches.RULES``' order
cdef enum:
    LAYER_VICTIM_CYCLES = 2        # ``bmoe.domain.streaming.victims.LAYER_VICTIM_CYCLES``

cdef enum:
    RULE_LRU = 0
    RULE_SLRU = 1
    RULE_LFU = 2
    N_RULES = 3


cdef struct core_t:
    int n_layer
    int n_expert
    int64_t * entry_bytes          # [n_layer]; 0: the layer has no routed experts
    # the eviction order over entries layer * n_expert + e: a doubly linked list from head,
    # probation (oldest first) then the protected segment (oldest first)
    int32_t * prev
    int32_t * next
    uint8_t * resident
    uint8_t * kept                 # [n_layer * n_expert]: in the protected segment
    int32_t kept_head              # the protected segment's oldest entry, -1: empty
    int64_t kept_bytes
    int n_expert_used              # k for the protected segment's cap; 0: k_seen
    int k_seen                     # the most ids one decode request wanted
    uint8_t * evicted_once
    uint8_t * wanted               # scratch [n_expert]
    uint8_t * prefetched           # [n_layer * n_expert]: issued ahead, not yet routed to:
                                   # AHEAD_PREFETCH, or AHEAD_WARM (a profile's warm-up)
    uint8_t * protected            # [n_expert]: the last request's ids (of protect_layer)
    int protect_layer
    int32_t * order                # [n_expert]: wanted ids of the request, first-seen order
    int32_t * count                # [n_expert]: how many times the request routed each id
    uint8_t * hot                  # scratch [n_expert]: the request's ids that stay hot
    int n_wanted
    int32_t head
    int32_t tail
    int64_t budget_bytes
    int64_t resident_bytes
    # the last plan (entry indices)
    int32_t * plan_hits            # [n_expert]
    int32_t * plan_loads           # [n_expert]
    int32_t * plan_evictions       # [n_layer * n_expert]
    int32_t * plan_adopted         # [n_expert]
    int n_adopted
    int n_hits
    int n_loads
    int n_evictions
    # counters
    int64_t requests
    int64_t hits
    int64_t misses
    int64_t evictions
    int64_t rereads
    int64_t bytes_read
    int64_t prefetch_issued
    int64_t prefetch_hits
    int64_t prefetch_wasted
    int64_t warm_issued            # read ahead by a usage profile's warm-up: not a prefetch
    int64_t passed                 # layer calls the layer, held whole, served without a request
    # the rule in charge, and eviction by frequency
    uint8_t layer_victims          # a miss evicts its own layer's entries first (``core_layer_first``)
    uint8_t rule                   # RULE_LRU, RULE_SLRU (evict from the head), RULE_LFU (fewest uses)
    uint8_t counting               # keep the use counts (lfu, adaptive)
    int32_t half_life              # decode tokens between halvings of every count
    int64_t ticks                  # decode requests since the last halving
    uint32_t * uses                # [n_layer * n_expert]: decayed use counts
    int32_t * heap                 # the resident entries, a min-heap by (uses, kept, label)
    int32_t * hpos                 # [n_layer * n_expert]: the entry's place in heap, -1: none
    int64_t * label                # [n_layer * n_expert]: its order within its segment
    int32_t n_heap
    int64_t p_lo
    int64_t p_hi
    int64_t k_hi
    # adaptive: the ghosts (NULL: a fixed rule) and the chooser
    core_t * ghost[N_RULES]
    uint8_t shares_sizes           # a ghost: entry_bytes is the live core's (not freed)
    int64_t window_requests        # decode requests a window (window tokens x MoE layers)
    int32_t margin_permille
    int64_t win_seen
    int64_t win_wanted
    int64_t win_hits[N_RULES]
    int64_t switches
    int64_t ghost_wanted           # entries every request fed to the ghosts wanted
    int64_t ghost_hits[N_RULES]    # ... and each ghost's hits on them
    # --cache-victims auto: the scope twin (NULL: none), this core under the other victims'
    # scope and the rule in charge, fed every request (``cache_twin.pxi``)
    core_t * twin
    int64_t cross_evictions        # evictions of another layer's entry by a request


cdef inline core_t * core_new(int n_layer, int n_expert) noexcept nogil:
    """A core with every entry size 0 and budget 0, or NULL when out of memory."""
    cdef core_t * c = <core_t *> calloc(1, sizeof(core_t))
    cdef int64_t n = <int64_t> n_layer * n_expert
    cdef int64_t i
    if c == NULL:
        return NULL
    c.n_layer = n_layer
    c.n_expert = n_expert
    c.entry_bytes = <int64_t *> calloc(n_layer, sizeof(int64_t))
    c.prev = <int32_t *> calloc(n, sizeof(int32_t))
    c.next = <int32_t *> calloc(n, sizeof(int32_t))
    c.resident = <uint8_t *> calloc(n, 1)
    c.evicted_once = <uint8_t *> calloc(n, 1)
    c.wanted = <uint8_t *> calloc(n_expert, 1)
    c.order = <int32_t *> calloc(n_expert, sizeof(int32_t))
    c.count = <int32_t *> calloc(n_expert, sizeof(int32_t))
    c.hot = <uint8_t *> calloc(n_expert, 1)
    c.plan_hits = <int32_t *> calloc(n_expert, sizeof(int32_t))
    c.plan_loads = <int32_t *> calloc(n_expert, sizeof(int32_t))
    c.plan_evictions = <int32_t *> calloc(n, sizeof(int32_t))
    c.plan_adopted = <int32_t *> calloc(n_expert, sizeof(int32_t))
    c.prefetched = <uint8_t *> calloc(n, 1)
    c.protected = <uint8_t *> calloc(n_expert, 1)
    c.kept = <uint8_t *> calloc(n, 1)
    c.uses = <uint32_t *> calloc(n, sizeof(uint32_t))
    c.heap = <int32_t *> calloc(n, sizeof(int32_t))
    c.hpos = <int32_t *> calloc(n, sizeof(int32_t))
    c.label = <int64_t *> calloc(n, sizeof(int64_t))
    c.half_life = 64
    c.rule = RULE_SLRU  # until ``core_set_rule``
    c.protect_layer = -1
    c.kept_head = -1
    if (c.entry_bytes == NULL or c.prev == NULL or c.next == NULL or c.resident == NULL
            or c.evicted_once == NULL or c.wanted == NULL or c.order == NULL
            or c.plan_hits == NULL or c.plan_loads == NULL or c.plan_evictions == NULL
            or c.plan_adopted == NULL or c.prefetched == NULL or c.protected == NULL
            or c.count == NULL or c.hot == NULL or c.kept == NULL or c.uses == NULL
            or c.heap == NULL or c.hpos == NULL or c.label == NULL):
        core_free(c)
        return NULL
    for i in range(n):
        c.prev[i] = -1
        c.next[i] = -1
        c.hpos[i] = -1
    c.head = -1
    c.tail = -1
    return c


cdef inline void core_free(core_t * c) noexcept nogil:
    cdef int r
    if c == NULL:
        return
    for r in range(N_RULES):
        core_free(c.ghost[r])
        c.ghost[r] = NULL
    core_free(c.twin)
    c.twin = NULL
    if not c.shares_sizes:
        free(c.entry_bytes)
    free(c.prev)
    free(c.next)
    free(c.resident)
    free(c.evicted_once)
    free(c.wanted)
    free(c.order)
    free(c.count)
    free(c.hot)
    free(c.plan_hits)
    free(c.plan_loads)
    free(c.plan_evictions)
    free(c.plan_adopted)
    free(c.prefetched)
    free(c.protected)
    free(c.kept)
    free(c.uses)
    free(c.heap)
    free(c.hpos)
    free(c.label)
    free(c)


include "cache_heap.pxi"


cdef inline void lru_unlink(core_t * c, int32_t i) noexcept nogil:
    if c.kept_head == i:
        c.kept_head = c.next[i]
    if c.prev[i] >= 0:
        c.next[c.prev[i]] = c.next[i]
    else:
        c.head = c.next[i]
    if c.next[i] >= 0:
        c.prev[c.next[i]] = c.prev[i]
    else:
        c.tail = c.prev[i]
    c.prev[i] = -1
    c.next[i] = -1


cdef inline void lru_prepend(core_t * c, int32_t i) noexcept nogil:
    """Link unlinked probation entry ``i`` at the list's head (probation's cold end)."""
    c.p_lo -= 1
    c.label[i] = c.p_lo
    heap_keyed(c, i)
    c.next[i] = c.head
    c.prev[i] = -1
    if c.head >= 0:
        c.prev[c.head] = i
    else:
        c.tail = i
    c.head = i


cdef inline void lru_append(core_t * c, int32_t i) noexcept nogil:
    c.prev[i] = c.tail
    c.next[i] = -1
    if c.tail >= 0:
        c.next[c.tail] = i
    else:
        c.head = i
    c.tail = i


cdef inline void lru_insert_before(core_t * c, int32_t i, int32_t at) noexcept nogil:
    c.prev[i] = c.prev[at]
    c.next[i] = at
    if c.prev[at] >= 0:
        c.next[c.prev[at]] = i
    else:
        c.head = i
    c.prev[at] = i


cdef inline void probation_mru(core_t * c, int32_t i) noexcept nogil:
    """Link unlinked probation entry ``i`` at probation's most recent end."""
    c.p_hi += 1
    c.label[i] = c.p_hi
    heap_keyed(c, i)
    if c.kept_head >= 0:
        lru_insert_before(c, i, c.kept_head)
    else:
        lru_append(c, i)


cdef inline void kept_mru(core_t * c, int32_t i) noexcept nogil:
    """Link unlinked protected entry ``i`` at the protected segment's most recent end."""
    c.k_hi += 1
    c.label[i] = c.k_hi
    heap_keyed(c, i)
    lru_append(c, i)
    if c.kept_head < 0:
        c.kept_head = i


cdef inline void core_touch(core_t * c, int32_t i) noexcept nogil:
    """Resident entry ``i`` to the most recent end of its own segment."""
    lru_unlink(c, i)
    if c.kept[i]:
        kept_mru(c, i)
    else:
        probation_mru(c, i)


cdef inline void core_promote(core_t * c, int32_t i) noexcept nogil:
    """Resident entry ``i`` to the protected segment's most recent end."""
    lru_unlink(c, i)
    if not c.kept[i]:
        c.kept[i] = 1
        c.kept_bytes += c.entry_bytes[i // c.n_expert]
    kept_mru(c, i)


cdef inline int64_t core_kept_cap(core_t * c) noexcept nogil:
    """The protected segment's byte cap: the budget less one token cycle (``k`` entries of
    every MoE layer), never below 0."""
    cdef int l
    cdef int64_t cycle = 0
    cdef int64_t k = c.n_expert_used if c.n_expert_used > 0 else c.k_seen
    if c.rule == RULE_LRU:
        return 0
    for l in range(c.n_layer):
        cycle += c.entry_bytes[l]
    cycle *= k
    return c.budget_bytes - cycle if c.budget_bytes > cycle else 0


cdef inline void core_fit_kept(core_t * c, int64_t cap) noexcept nogil:
    """Demote the protected segment's oldest entries to probation's most recent end (their
    place in the list) until it holds at most ``cap`` bytes."""
    cdef int32_t i
    while c.kept_bytes > cap:
        i = c.kept_head
        c.kept[i] = 0
        c.kept_bytes -= c.entry_bytes[i // c.n_expert]
        c.kept_head = c.next[i]
        c.p_hi += 1
        c.label[i] = c.p_hi
        heap_keyed(c, i)


cdef inline void core_evict(core_t * c, int32_t i) noexcept nogil:
    """Evict entry ``i`` and append it to the plan's evictions."""
    heap_remove(c, i)
    lru_unlink(c, i)
    if c.kept[i]:
        c.kept[i] = 0
        c.kept_bytes -= c.entry_bytes[i // c.n_expert]
    c.resident[i] = 0
    c.evicted_once[i] = 1
    c.resident_bytes -= c.entry_bytes[i // c.n_expert]
    c.evictions += 1
    if c.prefetched[i] == AHEAD_PREFETCH:
        c.prefetch_wasted += 1
    c.prefetched[i] = 0
    c.plan_evictions[c.n_evictions] = i
    c.n_evictions += 1


cdef inline bint core_keeps(core_t * c, int32_t i, int keep_layer, bint keep_protected) noexcept nogil:
    """Entry ``i`` may not be evicted: wanted at ``keep_layer``, or (``keep_protected``) one
    of the last request's."""
    if i // c.n_expert == keep_layer and c.wanted[i % c.n_expert]:
        return True
    return keep_protected and i // c.n_expert == c.protect_layer and c.protected[i % c.n_expert]


cdef inline int32_t core_lfu_victim(core_t * c, int keep_layer, bint keep_protected) noexcept nogil:
    """The resident entry with the fewest uses that may be evicted, the first in the list's
    order among equals; -1 when there is none. The heap's least entries that may not be
    evicted are taken out, set aside at the far end of the heap's array (``n_heap`` plus
    those set aside never exceed the entries) and put back after, the lowest address first
    (each push writes at most where the one it puts back was)."""
    cdef int32_t best = -1, n_out = 0, i
    cdef int32_t last = c.n_layer * c.n_expert - 1
    while c.n_heap > 0:
        i = c.heap[0]
        if not core_keeps(c, i, keep_layer, keep_protected):
            best = i
            break
        heap_remove(c, i)
        c.heap[last - n_out] = i
        n_out += 1
    while n_out > 0:
        n_out -= 1
        heap_push(c, c.heap[last - n_out])
    return best


cdef inline void core_age(core_t * c) noexcept nogil:
    """One decode request: every ``half_life`` tokens' worth, halve every use count."""
    cdef int l, n_moe = 0
    cdef int64_t i
    c.ticks += 1
    for l in range(c.n_layer):
        if c.entry_bytes[l] > 0:
            n_moe += 1
    if c.ticks < <int64_t> c.half_life * n_moe:
        return
    c.ticks = 0
    for i in range(<int64_t> c.n_layer * c.n_expert):
        c.uses[i] >>= 1
    heap_rebuild(c)  # halving made equals of unequal counts: the order within them changed


cdef inline int32_t core_layer_victim(core_t * c, int layer) noexcept nogil:
    """The resident entry of ``layer`` not wanted that goes first: the fewest uses (the heap's
    order) under LFU, else the first of the layer in the list's order; -1 when there is none."""
    cdef int32_t i, best = -1
    cdef int e
    if c.rule == RULE_LFU:
        for e in range(c.n_expert):
            i = layer * c.n_expert + e
            if c.resident[i] and not c.wanted[e] and (best < 0 or heap_less(c, i, best)):
                best = i
        return best
    i = c.head
    while i >= 0:
        if i // c.n_expert == layer and not c.wanted[i % c.n_expert]:
            return i
        i = c.next[i]
    return -1


cdef inline void core_evict_until(core_t * c, int64_t incoming, int keep_layer, bint first=False) noexcept nogil:
    """Evict from the head (or fewest uses first), skipping the wanted entries of
    ``keep_layer``, until it fits; with ``first``, ``keep_layer``'s own entries before any
    other's (``core_layer_first``)."""
    cdef int32_t i = c.head
    cdef int32_t nxt
    while first and c.resident_bytes + incoming > c.budget_bytes:
        i = core_layer_victim(c, keep_layer)
        if i < 0:
            break
        core_evict(c, i)
    i = c.head
    if c.rule == RULE_LFU:
        while c.resident_bytes + incoming > c.budget_bytes:
            i = core_lfu_victim(c, keep_layer, False)
            if i < 0:
                return
            core_evict(c, i)
        return
    while i >= 0 and c.resident_bytes + incoming > c.budget_bytes:
        nxt = c.next[i]
        if not (i // c.n_expert == keep_layer and c.wanted[i % c.n_expert]):
            core_evict(c, i)
        i = nxt


cdef inline void core_begin(core_t * c) noexcept nogil:
    """Start a request (and an empty plan)."""
    cdef int w
    for w in range(c.n_wanted):
        c.wanted[c.order[w]] = 0
        c.count[c.order[w]] = 0
    c.n_wanted = 0
    c.n_hits = 0
    c.n_loads = 0
    c.n_evictions = 0
    c.n_adopted = 0


cdef inline int core_want(core_t * c, int32_t e) noexcept nogil:
    """Add routed expert ``e`` to the request; -1 when it is out of range (nothing added)."""
    if e < 0 or e >= c.n_expert:
        return -1
    if not c.wanted[e]:
        c.wanted[e] = 1
        c.order[c.n_wanted] = e
        c.n_wanted += 1
    c.count[e] += 1
    return 0


cdef inline int core_share(core_t * c, int layer) noexcept nogil:
    """How many of a prefill request's experts stay hot at ``layer`` (at least 1)."""
    cdef int l, n_moe = 0
    cdef int64_t share
    for l in range(c.n_layer):
        if c.entry_bytes[l] > 0:
            n_moe += 1
    share = c.budget_bytes // c.entry_bytes[layer] // (n_moe if n_moe > 0 else 1)
    return <int> share if share >= 1 else 1


cdef inline bint core_layer_first(core_t * c, int layer) noexcept nogil:
    """A miss of ``layer`` evicts the layer's own entries first: ``layer_victims`` and a share
    of at least ``LAYER_VICTIM_CYCLES`` tokens' top-k, k known (as
    ``ExpertCachePolicy.layer_first``)."""
    cdef int k = c.n_expert_used if c.n_expert_used > 0 else c.k_seen
    return c.layer_victims != 0 and k > 0 and core_share(c, layer) >= LAYER_VICTIM_CYCLES * k


cdef inline void core_mark_hot(core_t * c, int layer, int n_tokens) noexcept nogil:
    """``hot[e]`` for the wanted ids that stay hot: all of them, or for a request of several
    tokens routing more than the share, the ``share`` most routed (ties: first routed)."""
    cdef int w, j, best, share
    for w in range(c.n_wanted):
        c.hot[c.order[w]] = 1
    if n_tokens <= 1:
        return
    share = core_share(c, layer)
    if c.n_wanted <= share:
        return
    for w in range(c.n_wanted):
        c.hot[c.order[w]] = 0
    for j in range(share):
        best = -1
        for w in range(c.n_wanted):
            if c.hot[c.order[w]]:
                continue
            if best < 0 or c.count[c.order[w]] > c.count[c.order[best]]:
                best = w
        c.hot[c.order[best]] = 1


cdef inline int core_plan_one(core_t * c, int layer, int n_tokens, int as_decode) noexcept nogil:
    """Decide the request of ``n_tokens`` tokens for ``layer``; returns the number of loads,
    or -1 when the layer has no routed experts (nothing changed). ``as_decode``: 1 for a
    decode step of several sequences (one token each: it counts as decode, every expert
    hot), 0 for a prefill, -1: decode exactly when it is one token."""
    cdef int w
    cdef int32_t idx
    cdef int64_t size, cap = 0
    cdef bint decode = n_tokens <= 1 if as_decode < 0 else as_decode != 0
    cdef uint8_t ahead
    if layer < 0 or layer >= c.n_layer or c.entry_bytes[layer] == 0:
        return -1
    size = c.entry_bytes[layer]
    c.requests += 1
    core_mark_hot(c, layer, 1 if decode else n_tokens)
    for w in range(c.n_expert):  # the request's entries are in use until the next request
        c.protected[w] = c.wanted[w]
    c.protect_layer = layer
    if c.counting:
        for w in range(c.n_wanted):
            idx = layer * c.n_expert + c.order[w]
            c.uses[idx] += 1
            if c.hpos[idx] >= 0:
                heap_fix(c, idx)
    if decode:
        if n_tokens <= 1 and c.n_wanted > c.k_seen:  # one token's top-k, not a step's union
            c.k_seen = c.n_wanted
        cap = core_kept_cap(c)
        core_fit_kept(c, cap)
    for w in range(c.n_wanted):
        idx = layer * c.n_expert + c.order[w]
        if c.resident[idx]:
            ahead = c.prefetched[idx]
            if decode and ahead != AHEAD_PREFETCH:  # a decode hit on an entry used before
                core_promote(c, idx)                # (or warmed: a plain hit)
                core_fit_kept(c, cap)
            elif c.hot[c.order[w]]:
                core_touch(c, idx)
            c.plan_hits[c.n_hits] = idx
            c.n_hits += 1
            if ahead:  # its read may still be in flight: the engine waits for it
                c.prefetched[idx] = 0
                if ahead == AHEAD_PREFETCH:
                    c.prefetch_hits += 1
                c.plan_adopted[c.n_adopted] = idx
                c.n_adopted += 1
        else:
            c.plan_loads[c.n_loads] = idx
            c.n_loads += 1
    c.hits += c.n_hits
    if c.n_loads == 0:
        if decode and c.counting:
            core_age(c)
        return 0
    core_evict_until(c, c.n_loads * size, layer, core_layer_first(c, layer))
    for w in range(c.n_evictions):
        if c.plan_evictions[w] // c.n_expert != layer:
            c.cross_evictions += 1
    for w in range(c.n_loads):
        idx = c.plan_loads[w]
        if c.evicted_once[idx]:
            c.rereads += 1
        c.resident[idx] = 1
        if c.hot[idx % c.n_expert]:
            probation_mru(c, idx)
        else:
            lru_prepend(c, idx)
    c.resident_bytes += c.n_loads * size
    c.misses += c.n_loads
    c.bytes_read += c.n_loads * size
    if decode and c.counting:
        core_age(c)  # after the request's decisions, as the policy's
    return c.n_loads


cdef inline bint core_holds_layer(core_t * c, int layer) noexcept nogil:
    """Every expert of ``layer`` resident and none waiting for its first use after a read
    ahead, as the policy's ``holds_layer``."""
    cdef int32_t i
    if layer < 0 or layer >= c.n_layer or c.entry_bytes[layer] <= 0:
        return False
    for i in range(layer * c.n_expert, (layer + 1) * c.n_expert):
        if not c.resident[i] or c.prefetched[i]:
            return False
    return True


cdef inline bint core_pass_layer(core_t * c, int layer) noexcept nogil:
    """As the policy's ``pass_layer``: True (counted in ``passed``) where the layer is held
    whole; nothing else changes."""
    if not core_holds_layer(c, layer):
        return False
    c.passed += 1
    return True


cdef inline void core_set_budget(core_t * c, int64_t budget_bytes) noexcept nogil:
    """Change the budget; evicts from the head down to it (the plan holds the evictions), then
    fits the protected segment to its cap."""
    cdef int r
    for r in range(N_RULES):
        if c.ghost[r] != NULL:
            core_set_budget(c.ghost[r], budget_bytes)
    if c.twin != NULL:
        core_set_budget(c.twin, budget_bytes)
    core_begin(c)
    c.budget_bytes = budget_bytes
    core_evict_until(c, 0, -1)
    core_fit_kept(c, core_kept_cap(c))


cdef inline void core_evict_all(core_t * c) noexcept nogil:
    """Evict every resident entry from the head (the plan holds the evictions)."""
    cdef int r
    for r in range(N_RULES):
        if c.ghost[r] != NULL:
            core_evict_all(c.ghost[r])
    if c.twin != NULL:
        core_evict_all(c.twin)
    core_begin(c)
    while c.head >= 0:
        core_evict(c, c.head)


cdef inline int core_prefetch(core_t * c, int layer, bint hot, bint warm=False) noexcept nogil:
    """Plan reads ahead for ``layer`` (the ids given with ``core_want``); ``hot`` for a
    committed routing; ``warm`` for a usage profile's warm-up (counted in ``warm_issued``,
    not as a prefetch: a later hit on it is a plain hit, adopted all the same). Returns the number issued (left in
    ``plan_loads``), or -1 when the layer has no routed experts."""
    cdef int w
    cdef int32_t idx, i, nxt
    cdef int64_t size
    if layer < 0 or layer >= c.n_layer or c.entry_bytes[layer] == 0:
        return -1
    size = c.entry_bytes[layer]
    for w in range(c.n_wanted):
        idx = layer * c.n_expert + c.order[w]
        if c.resident[idx]:
            if hot:
                core_touch(c, idx)
            continue
        i = c.head
        while c.rule == RULE_LFU and c.resident_bytes + size > c.budget_bytes:
            i = core_lfu_victim(c, layer, True)
            if i < 0:
                break
            core_evict(c, i)
        while c.rule != RULE_LFU and i >= 0 and c.resident_bytes + size > c.budget_bytes:
            nxt = c.next[i]
            if not core_keeps(c, i, layer, True):
                core_evict(c, i)
            i = nxt
        if c.resident_bytes + size > c.budget_bytes:
            break
        if c.evicted_once[idx]:
            c.rereads += 1
        c.resident[idx] = 1
        if hot:
            probation_mru(c, idx)
        else:
            lru_prepend(c, idx)
        c.resident_bytes += size
        c.prefetched[idx] = AHEAD_WARM if warm else AHEAD_PREFETCH
        c.plan_loads[c.n_loads] = idx
        c.n_loads += 1
    if warm:
        c.warm_issued += c.n_loads
    else:
        c.prefetch_issued += c.n_loads
    c.bytes_read += c.n_loads * size
    return c.n_loads



include "cache_twin.pxi"
include "cache_ghosts.pxi"
