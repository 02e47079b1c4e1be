# Parsing llama.cpp's graph node names (``ffn_moe_topk-12``), shared by the C callbacks.

cdef enum:
    TOPK_PREFIX_LEN = 13   # len("ffn_moe_topk-")
    PROBS_PREFIX_LEN = 14  # len("ffn_moe_probs-")


cdef inline int parse_layer(const char * name, int prefix_len) noexcept nogil:
    """The layer number after a ``prefix-`` of ``prefix_len`` bytes, or -1."""
    cdef int i = prefix_len
    cdef int value = 0
    cdef int digits = 0
    while name[i] >= 48 and name[i] <= 57 and digits < 9:
        value = value * 10 + (name[i] - 48)
        i += 1
        digits += 1
    if digits == 0 or name[i] != 0:
        return -1
    return value
