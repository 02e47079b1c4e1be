# One projection's read and landing: a read into the lane's bounce buffer then landed in its
# slice (copied, or repacked by llama.cpp's ``ggml_backend_tensor_set`` on the lane's copy of
# the template), or, for a projection that lands as read, straight into the slice's whole
# pages (``read_in_place``). The lanes (``lanes.pxi``) call ``fill_job`` and ``run_job``.
#
# Owns: nothing shared but its counters (``land_ns``, ``in_place_bytes``, atomically).

cdef int64_t read_exact(int fd, char * buf, int64_t length, int64_t offset) noexcept nogil:
    """Read up to ``length`` bytes; returns bytes read (short at EOF) or -errno."""
    cdef int64_t done = 0
    cdef long r
    while done < length:
        r = pread(fd, buf + done, length - done, offset + done)
        if r < 0:
            if errno == EINTR:
                continue
            return -errno
        if r == 0:
            break
        done += r
    return done


cdef void land(stream_t * s, job_t * job, int lane, const char * src) noexcept nogil:
    """Write one projection's bytes, read in the file's layout, into its slice: copied, or
    repacked by llama.cpp (``ggml_backend_tensor_set`` on the lane's copy of the template,
    pointed at the slice). Timed into ``land_ns``."""
    cdef ggml_tensor * t
    cdef long long t0 = now_ns()
    if job.repack == NULL:
        memcpy(job.dest, src, job.size)
    else:
        t = &s.lane_tensor[lane]
        t[0] = job.repack[0]
        t.data = job.dest
        s.tensor_set(t, src, 0, job.size)
    bmoe_fetch_add(&s.land_ns, now_ns() - t0)


cdef int read_in_place(stream_t * s, job_t * job, int lane) noexcept nogil:
    """An ``O_DIRECT`` read of a projection that lands as read (no repack): the slice's
    whole pages straight from the file, the partial pages at its ends (shared with the
    neighbouring slices) through the lane's bounce buffer, one ``preadv``. 0, -errno, or 1
    where it cannot (the slice's address not congruent with its file offset modulo a page,
    no whole page inside, or a short read): the caller reads it through the bounce buffer."""
    cdef uintptr_t d0 = <uintptr_t> job.dest
    cdef uintptr_t d1 = d0 + <uintptr_t> job.size
    cdef uintptr_t p0 = (d0 + PAGE - 1) & ~(<uintptr_t> (PAGE - 1))
    cdef uintptr_t p1 = d1 & ~(<uintptr_t> (PAGE - 1))
    cdef int64_t head = <int64_t> (p0 - d0)
    cdef int64_t tail = <int64_t> (d1 - p1)
    cdef iovec iov[3]
    cdef int n = 0
    cdef long r
    cdef long long t0
    if ((d0 - <uintptr_t> job.offset) & <uintptr_t> (PAGE - 1)) != 0 or p1 <= p0:
        return 1
    if head > 0:
        iov[n].iov_base = s.bounce[lane]
        iov[n].iov_len = PAGE
        n += 1
    iov[n].iov_base = <void *> p0
    iov[n].iov_len = p1 - p0
    n += 1
    if tail > 0:
        iov[n].iov_base = s.bounce[lane] + PAGE
        iov[n].iov_len = PAGE
        n += 1
    while True:
        r = preadv(job.fd, iov, n, job.offset & ~(<int64_t> (PAGE - 1)))
        if r >= 0 or errno != EINTR:
            break
    if r < 0:
        return -errno
    if r < (PAGE if head > 0 else 0) + <long> (p1 - p0) + tail:  # short (a tail page ends the file)
        return 1
    bmoe_fetch_add(&s.in_place_bytes, <long long> (p1 - p0))
    t0 = now_ns()
    if head > 0:
        memcpy(job.dest, s.bounce[lane] + PAGE - head, head)
    if tail > 0:
        memcpy(<void *> p1, s.bounce[lane] + PAGE, tail)
    bmoe_fetch_add(&s.land_ns, now_ns() - t0)
    return 0


cdef int run_job(stream_t * s, job_t * job, int lane) noexcept nogil:
    cdef int64_t a0, a1, got
    cdef char * buf
    cdef int direct
    if s.odirect and job.repack == NULL and s.read_in_place:
        direct = read_in_place(s, job, lane)
        if direct <= 0:
            return direct
    if s.odirect:
        a0 = job.offset & ~(<int64_t> (PAGE - 1))
        a1 = (job.offset + job.size + PAGE - 1) & ~(<int64_t> (PAGE - 1))
        buf = s.bounce[lane]
        got = read_exact(job.fd, buf, a1 - a0, a0)
        if got < 0:
            return <int> got
        if got < job.offset + job.size - a0:
            return -EIO
        land(s, job, lane, buf + (job.offset - a0))
        return 0
    if job.repack != NULL:  # the repack reads another buffer than it writes
        got = read_exact(job.fd, s.bounce[lane], job.size, job.offset)
        if got >= job.size:
            land(s, job, lane, s.bounce[lane])
            return 0
    else:
        got = read_exact(job.fd, job.dest, job.size, job.offset)
    if got < 0:
        return <int> got
    if got < job.size:
        return -EIO
    return 0


cdef void fill_job(stream_t * s, job_t * job, int layer, int expert, int p) noexcept nogil:
    cdef proj_t * pr = &s.projs[layer * s.n_proj + p]
    job.dest = pr.base + row_at(s, layer, expert) * pr.slice_bytes
    job.fd = s.fds[pr.file_index]
    job.file_index = pr.file_index
    job.offset = pr.file_offset + expert * pr.slice_bytes
    job.size = pr.slice_bytes
    job.result = 0
    job.repack = pr.repack
