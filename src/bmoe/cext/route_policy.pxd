# Routing decisions in C: ranking, agreement, cold-expert dropping, substitution. They
# follow ``bmoe.domain.streaming.routing`` decision for decision (same tie rules, weights in
# double precision summed in the same order); ``route_policy.pyx`` exposes them to Python
# so tests drive both with the same inputs. Shared by ``expert_stream`` (the engine).

from libc.math cimport exp
from libc.stdint cimport int32_t, int64_t, uint8_t


cdef inline void rp_rank(const float * scores, int n, int k, int32_t * out, uint8_t * chosen) noexcept nogil:
    """The ``k`` highest-scoring ids, best first, ties to the lower id (``chosen``: scratch
    of ``n`` bytes, left zeroed)."""
    cdef int j, e, best
    for j in range(k):
        best = -1
        for e in range(n):
            if chosen[e]:
                continue
            if best < 0 or scores[e] > scores[best]:
                best = e
        out[j] = best
        chosen[best] = 1
    for j in range(k):
        chosen[out[j]] = 0


cdef inline int rp_agreement(const int32_t * predicted, int n_pred, const int32_t * actual, int n_actual) noexcept nogil:
    """How many distinct ids of ``actual`` ``predicted`` names."""
    cdef int i, j, count = 0
    cdef bint seen, named
    for i in range(n_actual):
        seen = False
        for j in range(i):
            if actual[j] == actual[i]:
                seen = True
                break
        if seen:
            continue
        named = False
        for j in range(n_pred):
            if predicted[j] == actual[i]:
                named = True
                break
        if named:
            count += 1
    return count


cdef inline void rp_weights(const float * values, int k, bint from_logits, double * out) noexcept nogil:
    """The selected experts' weights, summing to 1 (see ``routing.routing_weights``)."""
    cdef int i
    cdef double top, total = 0.0
    if k <= 0:
        return
    if from_logits:
        top = values[0]
        for i in range(1, k):
            if values[i] > top:
                top = values[i]
        for i in range(k):
            out[i] = exp(<double> values[i] - top)
            total += out[i]
        for i in range(k):
            out[i] = out[i] / total
        return
    for i in range(k):
        total += values[i]
    if total <= 0.0:
        for i in range(k):
            out[i] = 1.0 / k
        return
    for i in range(k):
        out[i] = values[i] / total


cdef inline int rp_top_slot(const double * values, int k) noexcept nogil:
    cdef int i, best = 0
    for i in range(1, k):
        if values[i] > values[best]:
            best = i
    return best


cdef inline int rp_top_slot_f(const float * values, int k) noexcept nogil:
    cdef int i, best = 0
    for i in range(1, k):
        if values[i] > values[best]:
            best = i
    return best


cdef inline int rp_drop(const double * weights, const uint8_t * resident, int k, double fraction,
                        uint8_t * dropped) noexcept nogil:
    """Which slots to drop (``routing.drop_cold``); returns how many."""
    cdef int i, top, n = 0
    cdef double threshold
    for i in range(k):
        dropped[i] = 0
    if k == 0 or fraction <= 0.0:
        return 0
    threshold = fraction / k
    top = rp_top_slot(weights, k)
    for i in range(k):
        if i != top and not resident[i] and weights[i] < threshold:
            dropped[i] = 1
            n += 1
    return n


cdef inline int rp_substitute(int32_t * ids, int k, const float * scores, int n,
                              const uint8_t * resident, double margin, const float * selected_scores,
                              uint8_t * taken) noexcept nogil:
    """Rewrite ``ids`` in place (``routing.substitute``); returns how many slots changed.
    ``selected_scores``: ``scores`` at ``ids`` (scratch the caller filled); ``taken``: scratch
    of ``n`` bytes, left zeroed."""
    cdef int slot, cand, best, top, changed = 0
    cdef double floor
    if k == 0 or margin < 0.0:
        return 0
    top = rp_top_slot_f(selected_scores, k)
    for slot in range(k):
        taken[ids[slot]] = 1
    for slot in range(k):
        if slot == top or resident[ids[slot]]:
            continue
        floor = <double> scores[ids[slot]] - margin
        best = -1
        for cand in range(n):
            if not resident[cand] or taken[cand] or scores[cand] < floor:
                continue
            if best < 0 or scores[cand] > scores[best]:
                best = cand
        if best >= 0:
            ids[slot] = best
            taken[best] = 1
            changed += 1
    for cand in range(n):
        taken[cand] = 0
    return changed


cdef inline int rp_worth_reading(const int32_t * ranked, const double * weights, int k, double fraction,
                                 int32_t * out) noexcept nogil:
    """Drop-aware reads ahead (``routing.weight_threshold_ids``); returns how many."""
    cdef int i, top, n = 0
    cdef double threshold
    if fraction <= 0.0:
        for i in range(k):
            out[i] = ranked[i]
        return k
    if k == 0:
        return 0
    threshold = fraction / k
    top = rp_top_slot(weights, k)
    for i in range(k):
        if i == top or weights[i] >= threshold:
            out[n] = ranked[i]
            n += 1
    return n


cdef inline bint rp_gate_open(int64_t cold, int64_t slots, int pct) noexcept nogil:
    """``--predict-prefetch auto``'s gate (``decode_routing.auto_gate_open``): open while at
    most ``pct`` percent of the window's slots were cold; closed before any slot."""
    return slots > 0 and 100 * cold <= pct * slots
