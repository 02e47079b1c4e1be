# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The C routing decisions (``route_policy.pxd``, the code the streaming engine runs)
callable from Python, so tests drive them beside ``bmoe.domain.streaming.routing`` with
the same inputs and compare every decision."""

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free

from bmoe.cext.route_policy cimport (
    rp_agreement,
    rp_drop,
    rp_gate_open,
    rp_rank,
    rp_substitute,
    rp_weights,
    rp_worth_reading,
)


cdef float * _floats(values) except NULL:
    cdef int i
    cdef float * out = <float *> calloc(max(1, len(values)), sizeof(float))
    if out == NULL:
        raise MemoryError()
    for i, v in enumerate(values):
        out[i] = v
    return out


cdef int32_t * _ints(values) except NULL:
    cdef int i
    cdef int32_t * out = <int32_t *> calloc(max(1, len(values)), sizeof(int32_t))
    if out == NULL:
        raise MemoryError()
    for i, v in enumerate(values):
        out[i] = v
    return out


cdef uint8_t * _flags(values) except NULL:
    cdef int i
    cdef uint8_t * out = <uint8_t *> calloc(max(1, len(values)), 1)
    if out == NULL:
        raise MemoryError()
    for i, v in enumerate(values):
        out[i] = 1 if v else 0
    return out


cdef double * _doubles(values) except NULL:
    cdef int i
    cdef double * out = <double *> calloc(max(1, len(values)), sizeof(double))
    if out == NULL:
        raise MemoryError()
    for i, v in enumerate(values):
        out[i] = v
    return out


def rank(scores, int k):
    """``routing.rank`` in C (scores rounded to float32, as the engine holds them)."""
    cdef int n = len(scores)
    if not 0 <= k <= n:
        raise ValueError("need 0 <= k <= len(scores)")
    cdef float * s = _floats(scores)
    cdef int32_t * out = <int32_t *> calloc(max(1, k), sizeof(int32_t))
    cdef uint8_t * chosen = <uint8_t *> calloc(max(1, n), 1)
    try:
        if out == NULL or chosen == NULL:
            raise MemoryError()
        rp_rank(s, n, k, out, chosen)
        return [out[i] for i in range(k)]
    finally:
        free(s)
        free(out)
        free(chosen)


def slot_agreement(predicted, actual):
    cdef int32_t * p = _ints(predicted)
    cdef int32_t * a = _ints(actual)
    try:
        return rp_agreement(p, len(predicted), a, len(actual))
    finally:
        free(p)
        free(a)


def routing_weights(values, *, bint from_logits):
    cdef int k = len(values)
    cdef float * v = _floats(values)
    cdef double * out = <double *> calloc(max(1, k), sizeof(double))
    try:
        if out == NULL:
            raise MemoryError()
        rp_weights(v, k, from_logits, out)
        return [out[i] for i in range(k)]
    finally:
        free(v)
        free(out)


def drop_cold(weights, resident, double fraction):
    cdef int k = len(weights)
    cdef double * w = _doubles(weights)
    cdef uint8_t * r = _flags(resident)
    cdef uint8_t * dropped = <uint8_t *> calloc(max(1, k), 1)
    try:
        if dropped == NULL:
            raise MemoryError()
        rp_drop(w, r, k, fraction, dropped)
        return [dropped[i] != 0 for i in range(k)]
    finally:
        free(w)
        free(r)
        free(dropped)


def substitute(ids, scores, resident, double margin):
    cdef int k = len(ids)
    cdef int n = len(scores)
    cdef int32_t * out = _ints(ids)
    cdef float * s = _floats(scores)
    cdef uint8_t * r = _flags(resident)
    cdef float * sel = _floats([scores[e] for e in ids])
    cdef uint8_t * taken = <uint8_t *> calloc(max(1, n), 1)
    try:
        if taken == NULL:
            raise MemoryError()
        rp_substitute(out, k, s, n, r, margin, sel, taken)
        return [out[i] for i in range(k)]
    finally:
        free(out)
        free(s)
        free(r)
        free(sel)
        free(taken)


def weight_threshold_ids(ranked, weights, double fraction):
    cdef int k = len(ranked)
    cdef int32_t * rk = _ints(ranked)
    cdef double * w = _doubles(weights)
    cdef int32_t * out = <int32_t *> calloc(max(1, k), sizeof(int32_t))
    cdef int n
    try:
        if out == NULL:
            raise MemoryError()
        n = rp_worth_reading(rk, w, k, fraction, out)
        return [out[i] for i in range(n)]
    finally:
        free(rk)
        free(w)
        free(out)


def gate_open(int64_t cold, int64_t slots, int pct):
    """``decode_routing.auto_gate_open`` in C (with the percentage given)."""
    return bool(rp_gate_open(cold, slots, pct))
