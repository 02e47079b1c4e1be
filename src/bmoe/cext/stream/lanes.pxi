# The read lanes: lane 0 is the asking thread (llama.cpp's, inside the callback), lanes
# 1..n-1 worker threads blocked on ``lanes.work`` while the queue is empty. A read lands
# each projection of an entry in its slice (``reads.pxi``: copied from the bounce buffer,
# repacked by llama.cpp's ``ggml_backend_tensor_set``, or read in place), in the order the
# graph reads them. Plus opening and closing the files, bounce buffers and workers, and
# declaring where each projection lives (``proj_t``).
#
# Owns: ``lanes_t`` (queue, workers), ``projs``, ``io_state``, ``proj_ready``, the files
# and bounce buffers, ``io_s``. Calls: the core (``core_prefetch``: ``prefetch_wanted``, the
# one way a read ahead is planned and queued), pages (claim, release, evictions), traces
# (``trace_read``), faults.
# Locks: ``lanes.mu`` guards the queue, ``io_state`` and ``proj_ready``; a read itself runs
# without it (``read_popped`` drops it). Workers wait on ``lanes.work``, readers of a
# result on ``lanes.done``.

cdef int read_entry_now(stream_t * s, int32_t idx, int lane, bint stoppable=False) noexcept nogil:
    """Read every projection of entry ``idx`` on ``lane``; 0, or -errno after recording the
    read fault (sticky; the fault flag is raised). With ``stoppable``, 1 when it stopped
    between projections because the entry was evicted meanwhile (IO_ORPHAN; read without
    the mutex: at worst one projection more is read)."""
    cdef int j, p, result
    cdef job_t job
    cdef double t0 = 0.0
    cdef int layer = idx // s.core.n_expert
    cdef int order = bmoe_load(&s.proj_order_packed)  # one read: a whole permutation
    for j in range(s.n_proj):
        p = (order >> (4 * j)) & 15  # the graph's order: the first projection it reads first
        if s.projs[layer * s.n_proj + p].base == NULL:
            continue
        if stoppable and j > 0 and s.io_state[idx] == IO_ORPHAN:
            return 1
        if lane > 0 and s.lane_delay_us > 0:
            usleep(s.lane_delay_us)
        fill_job(s, &job, layer, idx % s.core.n_expert, p)
        if s.tr.io_on:
            t0 = now()
        result = run_job(s, &job, lane)
        if result == 0:
            bmoe_fetch_add(&s.landed_bytes, job.size)
        if s.tr.io_on and result == 0:
            trace_read(s, &job, idx, p, lane, t0)
        if result != 0:
            read_fault(s, -result, job.file_index, job.offset)
            return result
        if lane > 0 and j < s.n_proj - 1:  # a node may wait for it (the last: IO_IDLE)
            pthread_mutex_lock(&s.lanes.mu)
            s.proj_ready[idx] |= <uint8_t> (1 << p)
            pthread_cond_broadcast(&s.lanes.done)
            pthread_mutex_unlock(&s.lanes.mu)
    return 0


cdef int queue_push(stream_t * s, int32_t idx, bint front) noexcept nogil:
    """Queue entry ``idx`` (mutex held); -1 when the ring is full."""
    if s.lanes.queue_len >= s.lanes.queue_cap:
        return -1
    if front:
        s.lanes.queue_head = (s.lanes.queue_head - 1 + s.lanes.queue_cap) % s.lanes.queue_cap
        s.lanes.queue[s.lanes.queue_head] = idx
    else:
        s.lanes.queue[(s.lanes.queue_head + s.lanes.queue_len) % s.lanes.queue_cap] = idx
    s.lanes.queue_len += 1
    return 0


cdef int32_t queue_pop(stream_t * s) noexcept nogil:
    """The next queued entry still waiting to be read (mutex held), or -1."""
    cdef int32_t idx
    while s.lanes.queue_len > 0:
        idx = s.lanes.queue[s.lanes.queue_head]
        s.lanes.queue_head = (s.lanes.queue_head + 1) % s.lanes.queue_cap
        s.lanes.queue_len -= 1
        if s.io_state[idx] == IO_QUEUED:  # stale slots (cancelled, or moved to the front) skip
            return idx
    return -1


cdef void read_popped(stream_t * s, int32_t idx, int lane) noexcept nogil:
    """Read a popped entry (mutex held on entry and on return). One evicted while it runs
    (IO_ORPHAN) stops at the next projection and its pages go back here."""
    cdef double t0
    cdef bint stopped
    cdef long long cpu0
    s.io_state[idx] = IO_READING
    s.tr.active_reads += 1
    pthread_mutex_unlock(&s.lanes.mu)
    cpu0 = thread_cpu_ns()
    t0 = now()
    stopped = read_entry_now(s, idx, lane, True) == 1
    t0 = now() - t0
    cpu0 = thread_cpu_ns() - cpu0
    pthread_mutex_lock(&s.lanes.mu)
    if lane > 0:
        s.lane_cpu_ns += cpu0
    if stopped:
        s.orphans_cut += 1
    s.tr.active_reads -= 1
    s.io_s += t0
    if s.io_state[idx] == IO_ORPHAN:  # evicted meanwhile: its pages go back now
        release_locked(s, idx, &s.release_lanes_s)
        return
    s.io_state[idx] = IO_IDLE
    pthread_cond_broadcast(&s.lanes.done)


cdef void * lane_main(void * arg) noexcept nogil:
    cdef worker_arg_t * a = <worker_arg_t *> arg
    cdef stream_t * s = <stream_t *> a.stream
    cdef int32_t idx
    pthread_mutex_lock(&s.lanes.mu)
    while True:
        while not s.lanes.stop and s.lanes.queue_len == 0 and s.lanes.rel_len <= s.lanes.rel_bound:
            pthread_cond_wait(&s.lanes.work, &s.lanes.mu)
        if s.lanes.stop:
            break
        if s.lanes.rel_len > s.lanes.rel_bound and release_one(s, &s.release_lanes_s):
            continue
        idx = queue_pop(s)
        if idx >= 0:
            read_popped(s, idx, a.lane)
    pthread_mutex_unlock(&s.lanes.mu)
    return NULL


cdef void wake_lanes(stream_t * s) noexcept nogil:
    """Wake as many waiting workers as there are queued reads (mutex held): a worker drains
    the queue before it waits again, so one a read is enough. A broadcast woke every worker
    for each layer's one or two reads; on two cores each woken one took a core from the
    compute to find the queue empty."""
    cdef int n
    if s.wake_all:
        pthread_cond_broadcast(&s.lanes.work)
        return
    n = s.lanes.queue_len if s.lanes.queue_len < s.lanes.n_workers else s.lanes.n_workers
    while n > 0:
        pthread_cond_signal(&s.lanes.work)
        n -= 1


cdef void queue_plan_first(stream_t * s) noexcept nogil:
    """Put the plan's loads, and the adopted entries' reads still queued, at the front of the
    lanes' queue, in plan order (mutex held)."""
    cdef int w
    cdef int32_t idx
    for w in range(s.core.n_adopted - 1, -1, -1):
        idx = s.core.plan_adopted[w]
        if s.io_state[idx] == IO_QUEUED and queue_push(s, idx, True) < 0:
            read_popped(s, idx, 0)  # the ring is full: read it here
    for w in range(s.core.n_loads - 1, -1, -1):
        idx = s.core.plan_loads[w]
        if s.tr.io_on:
            s.tr.spec_entry[idx] = 0
        claim_for_read(s, idx)
        if queue_push(s, idx, True) < 0:
            read_popped(s, idx, 0)


cdef void issue_reads(stream_t * s) noexcept nogil:
    """Queue the prefetch plan's entries at the back for the workers (no waiting)."""
    cdef int w
    cdef int32_t idx
    if s.core.n_loads == 0:
        return
    if s.tr.io_on:
        for w in range(s.core.n_loads):
            s.tr.spec_entry[s.core.plan_loads[w]] = 1
    if s.lanes.started == 0 or s.lanes.n_workers == 0:  # nobody to read ahead: read now
        for w in range(s.core.n_loads):
            read_entry_now(s, s.core.plan_loads[w], 0)
        return
    pthread_mutex_lock(&s.lanes.mu)
    for w in range(s.core.n_loads):
        idx = s.core.plan_loads[w]
        claim_for_read(s, idx)
        if queue_push(s, idx, False) < 0:
            read_popped(s, idx, 0)
    wake_lanes(s)
    pthread_mutex_unlock(&s.lanes.mu)


cdef int prefetch_wanted(stream_t * s, int layer, bint hot, bint warm=False) noexcept nogil:
    """Read ahead the ids given with ``core_want`` for ``layer``: the core plans it
    (``core_prefetch``; ``warm``: a profile's warm-up), the plan's evictions go to the
    release ring and its reads are queued at the back. Returns the number issued (-1: the
    layer has no routed experts)."""
    cdef int issued = core_prefetch(s.core, layer, hot, warm)
    defer_planned_evictions(s)
    issue_reads(s)
    return issued


cdef int start_lanes(stream_t * s) noexcept nogil:
    """Create the n_lanes - 1 worker threads; 0, or an errno."""
    cdef int i, err
    pthread_mutex_init(&s.lanes.mu, NULL)
    pthread_cond_init(&s.lanes.work, NULL)
    pthread_cond_init(&s.lanes.done, NULL)
    s.lanes.n_workers = 0
    s.lanes.started = 1
    for i in range(1, s.n_lanes):
        s.worker_args[i].stream = <void *> s
        s.worker_args[i].lane = i
        err = pthread_create(&s.lanes.threads[i - 1], NULL, lane_main, &s.worker_args[i])
        if err != 0:
            stop_lanes(s)
            return err
        s.lanes.n_workers += 1
    return 0


cdef void stop_lanes(stream_t * s) noexcept nogil:
    """Join the workers (reads queued and not started are abandoned)."""
    cdef int i
    if s.lanes.started == 0:
        return
    release_all(s)
    pthread_mutex_lock(&s.lanes.mu)
    s.lanes.stop = 1
    pthread_cond_broadcast(&s.lanes.work)
    pthread_mutex_unlock(&s.lanes.mu)
    for i in range(s.lanes.n_workers):
        pthread_join(s.lanes.threads[i], NULL)
    s.lanes.n_workers = 0
    s.lanes.started = 0
    s.lanes.stop = 0
    s.lanes.queue_len = 0
    s.lanes.rel_len = 0
    pthread_cond_destroy(&s.lanes.work)
    pthread_cond_destroy(&s.lanes.done)
    pthread_mutex_destroy(&s.lanes.mu)


def fill_from_file(int fd, int64_t offset, uintptr_t address, int64_t length):
    """Copy ``length`` bytes of the file at ``offset`` to ``address`` (buffered reads)."""
    cdef int64_t done = 0
    cdef long r
    with nogil:
        while done < length:
            r = pread(fd, <char *> address + done, length - done, offset + done)
            if r < 0 and errno == EINTR:
                continue
            if r <= 0:
                break
            done += r
    if done < length:
        raise OSError(errno or EIO, f"short read filling {length} bytes at offset {offset}")


def drop_file_cache(int fd):
    """Ask the kernel to drop the file's pages from the page cache."""
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)


def o_direct_flag() -> int:
    return O_DIRECT


cdef proj_t * projection(stream_t * s, int layer, int proj) except NULL:
    if not (0 <= layer < s.core.n_layer and 0 <= proj < s.n_proj):
        raise ValueError("layer or projection out of range")
    return &s.projs[layer * s.n_proj + proj]


cdef int projection_declare(stream_t * s, int layer, int proj, char * base, int64_t slice_bytes,
                            int file_index, int64_t file_offset) except -1:
    """Where projection ``proj`` of ``layer`` lives in memory and in its file (once)."""
    cdef proj_t * pr = projection(s, layer, proj)
    if slice_bytes <= 0 or base == NULL:
        raise ValueError("slice_bytes must be positive and base non-null")
    if pr.base != NULL:
        raise ValueError(f"projection {proj} of layer {layer} is already set")
    pr.base = base
    pr.slice_bytes = slice_bytes
    pr.file_index = file_index
    pr.file_offset = file_offset
    s.core.entry_bytes[layer] += slice_bytes
    return 0


cdef int projection_repack(stream_t * s, int layer, int proj, ggml_tensor * template,
                           tensor_set_f tensor_set) except -1:
    """Land projection ``proj`` of ``layer`` repacked from now on (``land``)."""
    cdef proj_t * pr = projection(s, layer, proj)
    if pr.base == NULL:
        raise ValueError(f"projection {proj} of layer {layer} is not set")
    if template == NULL or tensor_set == NULL:
        raise ValueError("template and tensor_set must be non-null")
    pr.repack = template
    s.tensor_set = tensor_set
    return 0


cdef void lanes_close(stream_t * s) noexcept nogil:
    """Join the workers (the release ring emptied first), close the files, free the bounce
    buffers. Idempotent."""
    cdef int i
    stop_lanes(s)
    free(s.lanes.threads)
    s.lanes.threads = NULL
    free(s.worker_args)
    s.worker_args = NULL
    if s.fds != NULL:
        for i in range(s.n_files):
            if s.fds[i] >= 0:
                c_close(s.fds[i])
        free(s.fds)
        s.fds = NULL
        s.n_files = 0
    if s.bounce != NULL:
        for i in range(s.n_lanes):
            free(s.bounce[i])
        free(s.bounce)
        s.bounce = NULL
    free(s.lane_tensor)
    s.lane_tensor = NULL


cdef bint lanes_open(stream_t * s, paths, bint odirect, int n_lanes) except -1:
    """Open the model files (``O_DIRECT`` when asked and every file allows it; else all
    buffered), make one bounce buffer per lane (the largest slice, page aligned) and start
    the workers. True when the reads are direct; raises (all undone) on failure."""
    cdef int n = len(paths)
    cdef int i, fd, err
    cdef int64_t biggest = 0
    s.fds = <int *> calloc(n, sizeof(int))
    if s.fds == NULL:
        raise MemoryError()
    for i in range(n):
        s.fds[i] = -1
    s.n_files = n
    direct = odirect
    try:
        for i, path in enumerate(paths):
            encoded = str(path).encode()
            fd = -1
            if direct:
                fd = c_open(encoded, O_RDONLY | O_DIRECT)
                if fd < 0:
                    direct = False
            if fd < 0:
                fd = c_open(encoded, O_RDONLY)
            if fd < 0:
                raise OSError(errno, f"cannot open {path}: {strerror(errno).decode()}")
            s.fds[i] = fd
        if not direct:  # one mode for all files: reopen the ones opened direct
            for i, path in enumerate(paths):
                c_close(s.fds[i])
                s.fds[i] = c_open(str(path).encode(), O_RDONLY)
                if s.fds[i] < 0:
                    raise OSError(errno, f"cannot open {path}: {strerror(errno).decode()}")
        s.odirect = 1 if direct else 0
        for i in range(s.core.n_layer * s.n_proj):
            if s.projs[i].slice_bytes > biggest:
                biggest = s.projs[i].slice_bytes
        s.n_lanes = n_lanes
        s.lanes.rel_bound = 2 * n_lanes
        s.bounce_size = ((biggest + PAGE - 1) // PAGE + 1) * PAGE
        s.bounce = <char **> calloc(n_lanes, sizeof(char *))
        if s.bounce == NULL:
            raise MemoryError()
        for i in range(n_lanes):
            if posix_memalign(<void **> &s.bounce[i], PAGE, s.bounce_size) != 0:
                raise MemoryError()
        s.lane_tensor = <ggml_tensor *> calloc(n_lanes, sizeof(ggml_tensor))
        if s.lane_tensor == NULL:
            raise MemoryError()
        s.lanes.threads = <pthread_t *> calloc(n_lanes, sizeof(pthread_t))
        s.worker_args = <worker_arg_t *> calloc(n_lanes, sizeof(worker_arg_t))
        if s.lanes.threads == NULL or s.worker_args == NULL:
            raise MemoryError()
        err = start_lanes(s)
        if err != 0:
            raise OSError(err, f"cannot start the read lanes: {strerror(err).decode()}")
    except BaseException:
        with nogil:
            lanes_close(s)
        raise
    return direct
