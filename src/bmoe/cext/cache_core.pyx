# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The C cache core (``cache_core.pxd``, the code the streaming engine runs) callable from
Python, so tests drive it beside ``bmoe.domain.streaming.ExpertCachePolicy`` with the same
requests and compare every decision, and benchmarks time it without llama.cpp."""

from libc.stdint cimport int32_t, int64_t

from bmoe.cext.cache_core cimport (
    core_begin,
    core_evict_all,
    core_free,
    core_holds_layer,
    core_make_twin,
    core_new,
    core_pass_layer,
    core_plan,
    core_prefetch,
    core_set_budget,
    core_set_rule,
    core_set_victims,
    core_t,
    core_want,
    RULE_LFU,
    RULE_LRU,
    RULE_SLRU,
)
import bmoe.domain.streaming.rule_chooser as rule_chooser
from bmoe.domain.streaming.victims import VICTIMS

RULES = ("lru", "slru", "lfu")
EVICTION_CODES = {"lru": RULE_LRU, "slru": RULE_SLRU, "lfu": RULE_LFU, "adaptive": -1}


cdef class ExpertCacheCore:
    """``entry_bytes[layer]``: one entry's size per layer (0: no routed experts);
    ``n_expert_used``: experts per token for the protected segment's cap (0: from the decode
    requests), ``eviction``, ``half_life``, ``victims`` and ``scope_twin``, as the domain policy's;
    adaptive's chooser ``window_tokens`` and ``margin_permille`` (``bmoe.domain.streaming.rule_chooser``)."""

    cdef core_t * c

    def __cinit__(self, int64_t budget_bytes, entry_bytes, int n_expert, int n_expert_used=0, *,
                  str eviction="slru", int half_life=64, window_tokens=None, margin_permille=None,
                  str victims="global", bint scope_twin=False):
        cdef int layer
        if budget_bytes < 0 or n_expert <= 0 or len(entry_bytes) == 0:
            raise ValueError("need budget >= 0, n_expert > 0 and at least one layer")
        if n_expert_used < 0:
            raise ValueError("n_expert_used must be >= 0 (0: from the decode requests)")
        if any(b < 0 for b in entry_bytes):
            raise ValueError("entry sizes must be >= 0")
        if eviction not in EVICTION_CODES or half_life < 1:
            raise ValueError(f"eviction is one of {', '.join(EVICTION_CODES)}, half_life >= 1")
        window_tokens = rule_chooser.WINDOW_TOKENS if window_tokens is None else window_tokens
        margin_permille = rule_chooser.MARGIN_PERMILLE if margin_permille is None else margin_permille
        if window_tokens < 1 or margin_permille < 0:
            raise ValueError("the window must be >= 1 token and the margin >= 0")
        self.c = core_new(len(entry_bytes), n_expert)
        if self.c == NULL:
            raise MemoryError()
        for layer, size in enumerate(entry_bytes):
            self.c.entry_bytes[layer] = size
        self.c.budget_bytes = budget_bytes
        self.c.n_expert_used = n_expert_used
        if victims not in VICTIMS:
            raise ValueError(f"victims is one of {', '.join(VICTIMS)}")
        self.c.layer_victims = 1 if victims == "layer" else 0  # before the ghosts copy it
        if core_set_rule(self.c, EVICTION_CODES[eviction], half_life, window_tokens, margin_permille) != 0:
            raise MemoryError()
        if scope_twin and core_make_twin(self.c, eviction in ("lfu", "adaptive")) != 0:
            raise MemoryError()

    def __dealloc__(self):
        core_free(self.c)
        self.c = NULL

    cdef list _walk(self, core_t * g, int32_t i):
        """``g``'s entries from ``i`` along the list to its tail (none where ``g`` is NULL)."""
        out = []
        while g != NULL and i >= 0:
            out.append((i // g.n_expert, i % g.n_expert))
            i = g.next[i]
        return out

    cdef tuple _entries(self, int32_t * idx, int n):
        return tuple((idx[i] // self.c.n_expert, idx[i] % self.c.n_expert) for i in range(n))

    def _plan(self):
        return (
            self._entries(self.c.plan_hits, self.c.n_hits),
            self._entries(self.c.plan_evictions, self.c.n_evictions),
            self._entries(self.c.plan_loads, self.c.n_loads),
            self._entries(self.c.plan_adopted, self.c.n_adopted),
        )

    def request(self, int layer, ids, int n_tokens=1, decode=None):
        """Plan one MoE layer call of ``n_tokens`` tokens (``ids``: every token's, repeats
        included; ``decode``: as the domain policy's): ``(hits, evictions, loads, adopted)``
        as ``(layer, expert)`` tuples. Raises ``ValueError`` (state unchanged) like the
        domain policy does."""
        cdef int as_decode = -1 if decode is None else (1 if decode else 0)
        cdef int32_t e
        core_begin(self.c)
        for e in ids:
            if core_want(self.c, e) < 0:
                core_begin(self.c)
                raise ValueError(f"expert id {e} out of range [0, {self.c.n_expert}) at layer {layer}")
        if core_plan(self.c, layer, n_tokens, as_decode) < 0:
            raise ValueError(f"layer {layer} has no routed experts")
        return self._plan()

    def prefetch(self, int layer, ids, *, bint hot=False, bint warm=False):
        """Plan reads ahead (``hot``: a committed routing; ``warm``: a profile's warm-up):
        ``(evictions, issued)``. Raises ``ValueError`` like ``request``."""
        cdef int32_t e
        core_begin(self.c)
        for e in ids:
            if core_want(self.c, e) < 0:
                core_begin(self.c)
                raise ValueError(f"expert id {e} out of range [0, {self.c.n_expert}) at layer {layer}")
        if core_prefetch(self.c, layer, hot, warm) < 0:
            raise ValueError(f"layer {layer} has no routed experts")
        return (
            self._entries(self.c.plan_evictions, self.c.n_evictions),
            self._entries(self.c.plan_loads, self.c.n_loads),
        )

    def request_many(self, const int32_t[:, ::1] trace):
        """Plan a whole recorded trace, rows ``[layer, id0, id1, ...]``, without building
        plans for Python (for benchmarks). Returns the number of loads."""
        cdef Py_ssize_t r, j
        cdef int64_t loads = 0
        cdef int n
        with nogil:
            for r in range(trace.shape[0]):
                core_begin(self.c)
                for j in range(1, trace.shape[1]):
                    core_want(self.c, trace[r, j])
                n = core_plan(self.c, trace[r, 0], 1)
                if n > 0:
                    loads += n
        return loads

    def set_budget(self, int64_t budget_bytes):
        """Change the budget; returns what it evicted, oldest first."""
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        core_set_budget(self.c, budget_bytes)
        return self._entries(self.c.plan_evictions, self.c.n_evictions)

    def evict_all(self):
        core_evict_all(self.c)
        return self._entries(self.c.plan_evictions, self.c.n_evictions)

    def resident(self):
        """Resident entries in eviction order: probation oldest first, then protected."""
        return self._walk(self.c, self.c.head)

    def kept(self):
        """The protected segment's entries, oldest first (from ``kept_head`` to the tail)."""
        return self._walk(self.c, self.c.kept_head)

    def uses(self, int layer, int expert):
        """The entry's decayed use count (lfu and adaptive; 0 under the others)."""
        return self.c.uses[layer * self.c.n_expert + expert]

    @property
    def rule(self):
        """The eviction rule in charge (adaptive: the chooser's)."""
        return RULES[self.c.rule]

    @property
    def switches(self):
        """How many times the chooser handed the cache to another rule."""
        return self.c.switches

    def ghost_hits(self):
        """``(wanted, {rule: hits})``: the entries fed to the ghosts and each one's hits (adaptive;
        ``(0, {})`` otherwise)."""
        if self.c.ghost[0] == NULL:
            return 0, {}
        return self.c.ghost_wanted, {RULES[r]: self.c.ghost_hits[r] for r in range(3)}

    def ghost_resident(self, str rule):
        """The ghost of ``rule``'s entries in its eviction order (adaptive)."""
        cdef core_t * g = self.c.ghost[RULES.index(rule)]
        return self._walk(g, g.head if g != NULL else -1)

    @property
    def victims(self):
        """Whose entries a miss evicts now."""
        return "layer" if self.c.layer_victims else "global"

    def set_victims(self, str victims):
        """As ``ExpertCachePolicy.set_victims``: from the next request on; the twin takes the other."""
        if victims not in VICTIMS:
            raise ValueError(f"victims is one of {', '.join(VICTIMS)}")
        core_set_victims(self.c, 1 if victims == "layer" else 0)

    def twin_counters(self):
        """As ``ExpertCachePolicy.twin_counters``: the scope twin's hits, misses and evictions of
        another layer's entry (``{}`` without a twin)."""
        cdef core_t * g = self.c.twin
        if g == NULL:
            return {}
        return {"hits": g.hits, "misses": g.misses, "cross_evictions": g.cross_evictions}

    def twin_resident(self):
        """The scope twin's entries in its eviction order (``[]`` without a twin)."""
        cdef core_t * g = self.c.twin
        return self._walk(g, g.head if g != NULL else -1)

    @property
    def kept_bytes(self):
        return self.c.kept_bytes

    def check_valid(self):
        """The list's invariants: links agree both ways; the resident flags and bytes match
        the list; the entries before ``kept_head`` are probation, from it on protected, and
        ``kept_bytes`` is theirs."""
        c = self.c
        cdef int32_t i = c.head, prev = -1
        cdef int64_t total = 0, kept = 0
        cdef int n = 0, n_resident = 0
        seen_kept = False
        while i >= 0:
            assert c.prev[i] == prev and c.resident[i]
            if i == c.kept_head:
                seen_kept = True
            assert bool(c.kept[i]) == seen_kept
            total += c.entry_bytes[i // c.n_expert]
            if c.kept[i]:
                kept += c.entry_bytes[i // c.n_expert]
            n += 1
            prev = i
            i = c.next[i]
        assert c.tail == prev and (c.kept_head < 0) == (not seen_kept)
        for i in range(c.n_layer * c.n_expert):
            n_resident += c.resident[i]
        assert n == n_resident and total == c.resident_bytes and kept == c.kept_bytes

    @property
    def resident_bytes(self):
        return self.c.resident_bytes

    @property
    def budget_bytes(self):
        return self.c.budget_bytes

    def holds_layer(self, int layer):
        """As ``ExpertCachePolicy.holds_layer``."""
        return bool(core_holds_layer(self.c, layer))

    def pass_layer(self, int layer):
        """As ``ExpertCachePolicy.pass_layer``."""
        return bool(core_pass_layer(self.c, layer))

    def counters(self):
        c = self.c
        return {
            "requests": c.requests,
            "hits": c.hits,
            "misses": c.misses,
            "evictions": c.evictions,
            "rereads": c.rereads,
            "bytes_read": c.bytes_read,
            "prefetch_issued": c.prefetch_issued,
            "prefetch_hits": c.prefetch_hits,
            "prefetch_wasted": c.prefetch_wasted,
            "warm_issued": c.warm_issued,
            "passed": c.passed,
            "cross_evictions": c.cross_evictions,
        }
