# Faults: the first failure (a read, a routing node the engine cannot serve, the reference
# hook) is recorded and the context's fault flag raised; sticky, never cleared. The adapter
# turns ``fault_info`` into a typed error (``bmoe.domain.streaming.fault``).
#
# Owns: ``stream_t.fault*``. Calls: nothing.
# Locks: none; any thread (the first ``bmoe_claim`` wins, the flag is an atomic store).

_GRAPH_REASONS = {
    GRAPH_NO_EXPERTS: "the graph routes experts at a layer where none were found in the file",
    GRAPH_ID_RANGE: "the router selected an expert id out of range",
    GRAPH_IDS_TYPE: "the routing ids are not 32-bit integers",
    GRAPH_ON_DEVICE: "the routing ids live on a device and could not be copied back",
    GRAPH_ROWS: "the graph reads the routing ids where the experts' rows are not rewritten",
}



cdef void raise_fault_flag(stream_t * s) noexcept nogil:
    if s.fault_flag != NULL:
        bmoe_store(s.fault_flag, 1)


cdef void read_fault(stream_t * s, int err, int file_index, int64_t offset) noexcept nogil:
    if bmoe_claim(&s.fault):
        s.fault_kind = FAULT_READ
        s.fault_errno = err
        s.fault_file = file_index
        s.fault_offset = offset
    raise_fault_flag(s)


cdef void graph_fault(stream_t * s, int layer, int reason) noexcept nogil:
    if bmoe_claim(&s.fault):
        s.fault_kind = FAULT_GRAPH
        s.fault_layer = layer
        s.fault_reason = reason
    raise_fault_flag(s)


cdef void hook_fault(stream_t * s, int layer) noexcept nogil:
    if bmoe_claim(&s.fault):
        s.fault_kind = FAULT_HOOK
        s.fault_layer = layer
    raise_fault_flag(s)


cdef object fault_info(stream_t * s):
    """The first fault as Python values (``ExpertStreamer.fault``), or None."""
    if not s.fault:
        return None
    if s.fault_kind == FAULT_READ:
        return ("read", s.fault_file, s.fault_offset, s.fault_errno)
    if s.fault_kind == FAULT_GRAPH:
        return ("graph", s.fault_layer, _GRAPH_REASONS.get(s.fault_reason, "unknown"))
    return ("hook", s.fault_layer)
