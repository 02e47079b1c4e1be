# Expert rows: which row of its layer's expert tensors holds an entry's bytes. By default
# expert e's are in row e (``row_of`` NULL). With rows set (``set_rows``: today a fixed
# permutation that tests and benchmarks ask for, ``BMOE_EXPERT_ROWS=shuffled``), the reads
# land expert e of layer L in row ``row_of[L * n_expert + e]``, and the layer's routing ids
# are rewritten to rows once llama.cpp has gathered the router's weights with them (the
# ``GET_ROWS`` node that reads the topk ids), before an expert matmul reads them: the graph
# multiplies the same bytes by the same weights. A node that reads the ids after that by
# expert (a second ``GET_ROWS``, an ``ADD_ID`` of per-expert biases) or an expert matmul that
# reads them before it is a graph fault: the layout is not one rows can serve.
#
# Rows are set for ``--cache-victims layer`` (each layer's rows in order at first): a plan's
# victim hands its row to a load of its own layer (``swap_rows``: the victim takes the load's
# empty row), so the load is read over the victim's pages where a page move (``mremap``, a
# TLB shootdown to every core the process runs on) took them before. ``shuffled`` (tests)
# starts from a permutation instead, to prove the rewrite exact on every architecture.
#
# Owns: ``row_of``, ``rows_layer``, ``rows_rewritten``, ``rows_swapped``. Calls: faults.
# Locks: none. The eval thread swaps the rows of a settled victim and of a load not queued
# (IO_IDLE), so no lane reads either row meanwhile; a lane reads the row of the entry it
# reads, which no plan swaps while that read is queued or running.

cdef inline int64_t row_at(stream_t * s, int layer, int expert) noexcept nogil:
    """The row holding ``expert`` of ``layer``."""
    if s.row_of == NULL:
        return expert
    return s.row_of[layer * s.core.n_expert + expert]


cdef inline int topk_layer(ggml_tensor * ids) noexcept nogil:
    """The layer of a topk node (``ffn_moe_topk-L``); -1 for any other node."""
    if ids == NULL or strncmp(ids.name, b"ffn_moe_topk-", TOPK_PREFIX_LEN) != 0:
        return -1
    return parse_layer(ids.name, TOPK_PREFIX_LEN)


cdef void rewrite_rows(stream_t * s, ggml_tensor * ids, int layer) noexcept nogil:
    """Every id of the topk node ``ids`` (a view: read with its strides) to its row."""
    cdef int64_t i, j
    cdef int32_t * slot
    cdef int32_t e
    cdef char * base = <char *> ids.data
    cdef int32_t * rows = s.row_of + <int64_t> layer * s.core.n_expert
    if ids.type != GGML_TYPE_I32:
        graph_fault(s, layer, GRAPH_IDS_TYPE)
        return
    for j in range(ids.ne[1]):
        for i in range(ids.ne[0]):
            slot = <int32_t *> (base + i * ids.nb[0] + j * ids.nb[1])
            e = slot[0]
            if e < 0 or e >= s.core.n_expert:
                graph_fault(s, layer, GRAPH_ID_RANGE)
                return
            slot[0] = rows[e]
    s.rows_layer = layer
    s.rows_rewritten += 1


cdef int rows_node(stream_t * s, ggml_tensor * t, bint ask) noexcept nogil:
    """The callback's answer for a node the rows concern (module comment); -1 for any other
    node (and for every node where rows are not set)."""
    cdef int layer
    if s.row_of == NULL:
        return -1
    if ask and topk_layer(t) >= 0:  # a layer's routing: its ids are experts until gathered
        s.rows_layer = -1
        return -1
    if t.op == GGML_OP_GET_ROWS:
        layer = topk_layer(t.src[1])
        if layer < 0 or s.layer_elsewhere[layer]:
            return -1
        if s.rows_layer == layer:  # gathered by expert again, from ids that are rows now
            graph_fault(s, layer, GRAPH_ROWS)
            return ask == 0
        if ask:
            return 1
        if not in_host_memory(s, t.src[1]):
            graph_fault(s, layer, GRAPH_ON_DEVICE)
            return 1
        rewrite_rows(s, t.src[1], layer)
        return 1
    if t.op == GGML_OP_ADD_ID or t.op == GGML_OP_MUL_MAT_ID:
        layer = topk_layer(t.src[2])
        if layer < 0 or s.layer_elsewhere[layer]:
            return -1
        if (t.op == GGML_OP_ADD_ID) == (s.rows_layer == layer):
            graph_fault(s, layer, GRAPH_ROWS)  # biases by row, or experts by id
            return ask == 0
    return -1


cdef bint swap_rows(stream_t * s, int32_t victim, int32_t target) noexcept nogil:
    """Hand evicted ``victim``'s row (its pages, read over) to ``target``, a load of the same
    layer not queued (IO_IDLE: its own row holds no page), and the empty row to the victim;
    False (nothing done) where rows are off or they are not so."""
    cdef int n = s.core.n_expert
    cdef int32_t row
    if s.row_of == NULL or victim // n != target // n or s.io_state[target] != IO_IDLE:
        return False
    row = s.row_of[victim]
    s.row_of[victim] = s.row_of[target]
    s.row_of[target] = row
    s.rows_swapped += 1
    return True


cdef int set_rows(stream_t * s, const int32_t * rows) noexcept nogil:
    """Take ``rows`` (``n_layer * n_expert``: each layer's a permutation of its experts) as
    where the entries' bytes live; NULL: each in its own row. Before the first read only.
    0, or -1 without memory."""
    cdef int64_t n = <int64_t> s.core.n_layer * s.core.n_expert
    if rows == NULL:
        free_clear(<void **> &s.row_of)
        return 0
    if s.row_of == NULL:
        s.row_of = <int32_t *> calloc(n, sizeof(int32_t))
        if s.row_of == NULL:
            return -1
    memcpy(s.row_of, rows, n * sizeof(int32_t))
    return 0
