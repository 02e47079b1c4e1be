# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Expert streaming: the C mechanism (memory, reads, the LRU, the eval callback).

``ExpertStreamer`` owns a C eval callback for a llama context. Modes:

- ``MODE_CAPTURE``: during a warm-up decode, the ``ask`` pass records the address of every
  weight (leaf) tensor the graph reads, by name; nothing is computed differently.
- ``MODE_STREAM``: at every ``ffn_moe_topk-L`` node (its data ready, no expert of layer L
  used yet), the callback gathers the selected ids, touches the resident ones, evicts
  least-recently-used entries down to the byte budget, and reads every missing expert
  slice of layer L from its file before returning (``pread`` on N lanes, ``O_DIRECT``
  through page-aligned bounce buffers). The policy is exactly ``bmoe.domain.expert_lru``.

Expert memory is llama.cpp's own mapping of the GGUF, overlaid by ``overlay()`` with
anonymous private memory (``MAP_FIXED | MAP_NORESERVE``): pages cost nothing until a read
fills them, eviction gives them back with ``madvise(MADV_DONTNEED)`` (pages wholly inside
the slice only, so bytes of a neighbour are never dropped), and a slice that is not
resident reads as zeros. A failed or short read records a fault and raises the context's
abort flag, so ``llama_decode`` returns 2 instead of computing with a missing expert.
"""

from libc.errno cimport EINTR, EIO, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset, strncmp, strncpy
from posix.fcntl cimport O_RDONLY, open as c_open
from posix.mman cimport (
    MADV_DONTNEED,
    MADV_HUGEPAGE,
    MADV_NOHUGEPAGE,
    MAP_ANONYMOUS,
    MAP_FAILED,
    MAP_FIXED,
    MAP_NORESERVE,
    MAP_PRIVATE,
    PROT_READ,
    PROT_WRITE,
    madvise,
    mmap,
)
from posix.stdlib cimport posix_memalign
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport close as c_close, pread

from cython.parallel cimport prange, threadid

from bmoe.cext.graph_names cimport TOPK_PREFIX_LEN, parse_layer
from bmoe.cext.ggml cimport GGML_OP_NONE, GGML_TYPE_I32, bool, ggml_tensor

cdef extern from "fcntl.h" nogil:
    enum:
        O_DIRECT
    int posix_fadvise(int fd, long offset, long length, int advice)
    enum:
        POSIX_FADV_DONTNEED

cdef extern from "string.h" nogil:
    char * strerror(int errnum)

cdef enum:
    C_MODE_OFF = 0
    C_MODE_CAPTURE = 1
    C_MODE_STREAM = 2

MODE_OFF = C_MODE_OFF
MODE_CAPTURE = C_MODE_CAPTURE
MODE_STREAM = C_MODE_STREAM

cdef enum:
    PAGE = 4096
    MAX_CAPTURE = 16384
    NAME_LEN = 64


cdef struct proj_t:
    char * base            # address of expert 0 (NULL: this layer has no such projection)
    int64_t slice_bytes    # nb[2]
    int file_index
    int64_t file_offset    # of expert 0


cdef struct job_t:
    char * dest
    int fd
    int64_t offset
    int64_t size
    int result             # 0, or -errno; -EIO for a short read
    int file_index


cdef struct capture_t:
    char name[64]
    uintptr_t address


cdef struct stream_t:
    int mode
    int n_layer
    int n_expert
    int n_proj
    proj_t * projs                 # [n_layer * n_proj]
    int64_t * entry_bytes          # [n_layer]: sum over projections of slice_bytes
    # LRU over entries layer * n_expert + e: a doubly linked list, oldest at head
    int32_t * prev
    int32_t * next
    uint8_t * resident
    uint8_t * evicted_once
    uint8_t * wanted               # scratch [n_expert]
    int32_t * order                # scratch [n_expert]: wanted ids, first-seen order
    int32_t head
    int32_t tail
    int64_t budget_bytes
    int64_t resident_bytes
    # counters
    int64_t hits
    int64_t misses
    int64_t evictions
    int64_t rereads
    int64_t bytes_read
    int64_t n_requests
    double io_s
    double mgmt_s
    # reads
    int * fds
    int n_files
    int odirect
    int n_lanes
    char ** bounce                 # [n_lanes], each bounce_size bytes, page aligned
    int64_t bounce_size
    job_t * jobs                   # scratch [n_expert * n_proj]
    # faults
    int fault
    int fault_errno
    int fault_file
    int64_t fault_offset
    int * abort_flag
    # capture
    capture_t * captured
    int n_captured
    int capture_overflow


cdef inline double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9




# -- the LRU list ------------------------------------------------------------------------

cdef inline void lru_unlink(stream_t * s, int32_t i) noexcept nogil:
    if s.prev[i] >= 0:
        s.next[s.prev[i]] = s.next[i]
    else:
        s.head = s.next[i]
    if s.next[i] >= 0:
        s.prev[s.next[i]] = s.prev[i]
    else:
        s.tail = s.prev[i]
    s.prev[i] = -1
    s.next[i] = -1


cdef inline void lru_append(stream_t * s, int32_t i) noexcept nogil:
    s.prev[i] = s.tail
    s.next[i] = -1
    if s.tail >= 0:
        s.next[s.tail] = i
    else:
        s.head = i
    s.tail = i


cdef void drop_pages(stream_t * s, int layer, int expert) noexcept nogil:
    """Give back the pages wholly inside each projection slice of one expert."""
    cdef int p
    cdef proj_t * pr
    cdef uintptr_t start, end, p0, p1
    for p in range(s.n_proj):
        pr = &s.projs[layer * s.n_proj + p]
        if pr.base == NULL:
            continue
        start = <uintptr_t> pr.base + <uintptr_t> (expert * pr.slice_bytes)
        end = start + <uintptr_t> pr.slice_bytes
        p0 = (start + PAGE - 1) & ~(<uintptr_t> (PAGE - 1))
        p1 = end & ~(<uintptr_t> (PAGE - 1))
        if p1 > p0:
            madvise(<void *> p0, p1 - p0, MADV_DONTNEED)


cdef void evict(stream_t * s, int32_t i) noexcept nogil:
    cdef int layer = i // s.n_expert
    lru_unlink(s, i)
    s.resident[i] = 0
    s.evicted_once[i] = 1
    s.resident_bytes -= s.entry_bytes[layer]
    s.evictions += 1
    drop_pages(s, layer, i % s.n_expert)


cdef void evict_until(stream_t * s, int64_t incoming, int keep_layer) noexcept nogil:
    """Evict oldest first, skipping the wanted entries of ``keep_layer``, until it fits."""
    cdef int32_t i = s.head
    cdef int32_t nxt
    while i >= 0 and s.resident_bytes + incoming > s.budget_bytes:
        nxt = s.next[i]
        if not (i // s.n_expert == keep_layer and s.wanted[i % s.n_expert]):
            evict(s, i)
        i = nxt


# -- reads -------------------------------------------------------------------------------

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


cdef int run_job(stream_t * s, job_t * job, int lane) noexcept nogil:
    cdef int64_t a0, a1, got
    cdef char * buf
    if s.odirect:
        a0 = job.offset & ~(<int64_t> (PAGE - 1))
        a1 = (job.offset + job.size + PAGE - 1) & ~(<int64_t> (PAGE - 1))
        buf = s.bounce[lane]
        got = read_exact(job.fd, buf, a1 - a0, a0)
        if got < 0:
            return <int> got
        if got < job.offset + job.size - a0:
            return -EIO
        memcpy(job.dest, buf + (job.offset - a0), job.size)
        return 0
    got = read_exact(job.fd, job.dest, job.size, job.offset)
    if got < 0:
        return <int> got
    if got < job.size:
        return -EIO
    return 0


cdef void run_jobs(stream_t * s, int n_jobs) noexcept nogil:
    cdef int j
    cdef int lanes = s.n_lanes if s.n_lanes < n_jobs else n_jobs
    if lanes <= 1:
        for j in range(n_jobs):
            s.jobs[j].result = run_job(s, &s.jobs[j], 0)
        return
    for j in prange(n_jobs, num_threads=lanes, schedule="dynamic"):
        s.jobs[j].result = run_job(s, &s.jobs[j], threadid())


# -- the demand path ---------------------------------------------------------------------

cdef void demand(stream_t * s, ggml_tensor * t, int layer) noexcept nogil:
    cdef int64_t k = t.ne[0]
    cdef int64_t n_tokens = t.ne[1]
    cdef int64_t i, j
    cdef int32_t e, idx
    cdef int n_wanted = 0
    cdef int n_miss = 0
    cdef int n_jobs = 0
    cdef int p, m, w
    cdef char * base = <char *> t.data
    cdef proj_t * pr
    cdef double t0, t_io
    if layer >= s.n_layer or s.entry_bytes[layer] == 0 or t.type != GGML_TYPE_I32:
        return
    t0 = now()
    s.n_requests += 1
    memset(s.wanted, 0, s.n_expert)
    for j in range(n_tokens):
        for i in range(k):
            e = (<int32_t *> (base + i * t.nb[0] + j * t.nb[1]))[0]
            if e >= 0 and e < s.n_expert and not s.wanted[e]:
                s.wanted[e] = 1
                s.order[n_wanted] = e
                n_wanted += 1
    # hits first (touched in wanted order), as the reference policy does
    for w in range(n_wanted):
        idx = layer * s.n_expert + s.order[w]
        if s.resident[idx]:
            s.hits += 1
            lru_unlink(s, idx)
            lru_append(s, idx)
        else:
            n_miss += 1
    if n_miss == 0:
        s.mgmt_s += now() - t0
        return
    evict_until(s, n_miss * s.entry_bytes[layer], layer)
    for w in range(n_wanted):
        e = s.order[w]
        idx = layer * s.n_expert + e
        if s.resident[idx]:
            continue
        for p in range(s.n_proj):
            pr = &s.projs[layer * s.n_proj + p]
            if pr.base == NULL:
                continue
            s.jobs[n_jobs].dest = pr.base + e * pr.slice_bytes
            s.jobs[n_jobs].fd = s.fds[pr.file_index]
            s.jobs[n_jobs].file_index = pr.file_index
            s.jobs[n_jobs].offset = pr.file_offset + e * pr.slice_bytes
            s.jobs[n_jobs].size = pr.slice_bytes
            s.jobs[n_jobs].result = 0
            n_jobs += 1
    t_io = now()
    run_jobs(s, n_jobs)
    t_io = now() - t_io
    s.io_s += t_io
    for m in range(n_jobs):
        if s.jobs[m].result != 0 and not s.fault:
            s.fault = 1
            s.fault_errno = -s.jobs[m].result
            s.fault_file = s.jobs[m].file_index
            s.fault_offset = s.jobs[m].offset
    if s.fault:
        if s.abort_flag != NULL:
            (<volatile int *> s.abort_flag)[0] = 1
        s.mgmt_s += now() - t0 - t_io
        return
    for w in range(n_wanted):
        idx = layer * s.n_expert + s.order[w]
        if s.resident[idx]:
            continue
        if s.evicted_once[idx]:
            s.rereads += 1
        s.resident[idx] = 1
        lru_append(s, idx)
        s.resident_bytes += s.entry_bytes[layer]
        s.misses += 1
        s.bytes_read += s.entry_bytes[layer]
    s.mgmt_s += now() - t0 - t_io


cdef void capture(stream_t * s, ggml_tensor * t) noexcept nogil:
    cdef int j, c
    cdef ggml_tensor * src
    cdef int known
    for j in range(10):
        src = t.src[j]
        if src == NULL or src.op != GGML_OP_NONE or src.data == NULL or src.name[0] == 0:
            continue
        known = 0
        for c in range(s.n_captured):
            if strncmp(s.captured[c].name, src.name, NAME_LEN) == 0:
                known = 1
                break
        if known:
            continue
        if s.n_captured >= MAX_CAPTURE:
            s.capture_overflow = 1
            return
        strncpy(s.captured[s.n_captured].name, src.name, NAME_LEN - 1)
        s.captured[s.n_captured].name[NAME_LEN - 1] = 0
        s.captured[s.n_captured].address = <uintptr_t> src.data
        s.n_captured += 1


cdef bool stream_callback(ggml_tensor * t, bool ask, void * user_data) noexcept nogil:
    cdef stream_t * s = <stream_t *> user_data
    cdef int layer
    if s.mode == C_MODE_CAPTURE:
        if ask:
            capture(s, t)
            return 0
        return 1
    if s.mode != C_MODE_STREAM or s.fault:
        return ask == 0
    if strncmp(t.name, b"ffn_moe_topk-", TOPK_PREFIX_LEN) != 0:
        return ask == 0
    layer = parse_layer(t.name, TOPK_PREFIX_LEN)
    if layer < 0:
        return ask == 0
    if ask:
        return 1
    demand(s, t, layer)
    return 1


# -- memory helpers (Python-callable) -----------------------------------------------------

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


cdef class ExpertStreamer:
    """Owns the streaming state; keep it alive as long as the context that calls it."""

    cdef stream_t * s

    def __cinit__(self, *, int n_layer, int n_expert, int n_proj, uintptr_t abort_flag_address=0):
        cdef stream_t * s
        cdef int64_t i
        if n_layer <= 0 or n_expert <= 0 or n_proj <= 0:
            raise ValueError("n_layer, n_expert and n_proj must be positive")
        self.s = <stream_t *> calloc(1, sizeof(stream_t))
        if self.s == NULL:
            raise MemoryError()
        s = self.s
        s.n_layer = n_layer
        s.n_expert = n_expert
        s.n_proj = n_proj
        n_entries = n_layer * n_expert
        s.projs = <proj_t *> calloc(n_layer * n_proj, sizeof(proj_t))
        s.entry_bytes = <int64_t *> calloc(n_layer, sizeof(int64_t))
        s.prev = <int32_t *> calloc(n_entries, sizeof(int32_t))
        s.next = <int32_t *> calloc(n_entries, sizeof(int32_t))
        s.resident = <uint8_t *> calloc(n_entries, 1)
        s.evicted_once = <uint8_t *> calloc(n_entries, 1)
        s.wanted = <uint8_t *> calloc(n_expert, 1)
        s.order = <int32_t *> calloc(n_expert, sizeof(int32_t))
        s.jobs = <job_t *> calloc(n_expert * n_proj, sizeof(job_t))
        s.captured = <capture_t *> calloc(MAX_CAPTURE, sizeof(capture_t))
        if (s.projs == NULL or s.entry_bytes == NULL or s.prev == NULL or s.next == NULL
                or s.resident == NULL or s.evicted_once == NULL or s.wanted == NULL
                or s.order == NULL or s.jobs == NULL or s.captured == NULL):
            raise MemoryError()
        for i in range(n_entries):
            s.prev[i] = -1
            s.next[i] = -1
        s.head = -1
        s.tail = -1
        s.abort_flag = <int *> abort_flag_address

    def __dealloc__(self):
        cdef int i
        cdef stream_t * s
        if self.s == NULL:
            return
        s = self.s
        if s.fds != NULL:
            for i in range(s.n_files):
                if s.fds[i] >= 0:
                    c_close(s.fds[i])
            free(s.fds)
        if s.bounce != NULL:
            for i in range(s.n_lanes):
                free(s.bounce[i])
            free(s.bounce)
        free(s.projs)
        free(s.entry_bytes)
        free(s.prev)
        free(s.next)
        free(s.resident)
        free(s.evicted_once)
        free(s.wanted)
        free(s.order)
        free(s.jobs)
        free(s.captured)
        free(s)
        self.s = NULL

    # -- wiring ----------------------------------------------------------------------------

    @property
    def callback_address(self) -> int:
        return <uintptr_t> &stream_callback

    @property
    def user_data_address(self) -> int:
        return <uintptr_t> self.s

    @property
    def mode(self) -> int:
        return self.s.mode

    @mode.setter
    def mode(self, int value):
        if value not in (MODE_OFF, MODE_CAPTURE, MODE_STREAM):
            raise ValueError(f"unknown mode {value}")
        self.s.mode = value

    def captured(self):
        """``{tensor name: address}`` of every weight seen in capture mode."""
        out = {}
        for c in range(self.s.n_captured):
            out[self.s.captured[c].name.decode("utf-8", "replace")] = self.s.captured[c].address
        return out

    def set_projection(self, int layer, int proj, uintptr_t base, int64_t slice_bytes,
                       int file_index, int64_t file_offset):
        """Declare where projection ``proj`` of ``layer`` lives in memory and in its file."""
        if not (0 <= layer < self.s.n_layer and 0 <= proj < self.s.n_proj):
            raise ValueError("layer or projection out of range")
        if slice_bytes <= 0:
            raise ValueError("slice_bytes must be positive")
        cdef proj_t * pr = &self.s.projs[layer * self.s.n_proj + proj]
        if pr.base != NULL:
            raise ValueError(f"projection {proj} of layer {layer} is already set")
        pr.base = <char *> base
        pr.slice_bytes = slice_bytes
        pr.file_index = file_index
        pr.file_offset = file_offset
        self.s.entry_bytes[layer] += slice_bytes

    def open_files(self, paths, *, bint odirect=True, int n_lanes=4):
        """Open the model files for reading (``O_DIRECT`` when asked and possible).

        Returns True when every file was opened with ``O_DIRECT``, False when it fell back
        to buffered reads (or was asked to).
        """
        if n_lanes < 1:
            raise ValueError("n_lanes must be >= 1")
        if self.s.fds != NULL:
            raise ValueError("files are already open")
        cdef int n = len(paths)
        cdef int i, fd
        cdef int64_t biggest = 0
        self.s.fds = <int *> calloc(n, sizeof(int))
        if self.s.fds == NULL:
            raise MemoryError()
        for i in range(n):
            self.s.fds[i] = -1
        self.s.n_files = n
        direct = odirect
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
            self.s.fds[i] = fd
        if not direct:  # one mode for all files: reopen the ones opened direct
            for i, path in enumerate(paths):
                c_close(self.s.fds[i])
                self.s.fds[i] = c_open(str(path).encode(), O_RDONLY)
                if self.s.fds[i] < 0:
                    raise OSError(errno, f"cannot open {path}: {strerror(errno).decode()}")
        self.s.odirect = 1 if direct else 0
        for i in range(self.s.n_layer * self.s.n_proj):
            if self.s.projs[i].slice_bytes > biggest:
                biggest = self.s.projs[i].slice_bytes
        self.s.n_lanes = n_lanes
        self.s.bounce_size = ((biggest + PAGE - 1) // PAGE + 1) * PAGE
        self.s.bounce = <char **> calloc(n_lanes, sizeof(char *))
        if self.s.bounce == NULL:
            raise MemoryError()
        cdef void * mem
        for i in range(n_lanes):
            if posix_memalign(&mem, PAGE, self.s.bounce_size) != 0:
                raise MemoryError()
            self.s.bounce[i] = <char *> mem
        return True if direct else False

    def file_descriptor(self, int index) -> int:
        return self.s.fds[index]

    # -- the cache -------------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self.s.budget_bytes

    def set_budget(self, int64_t budget_bytes):
        """Change the byte budget between decodes; evicts LRU-first down to it."""
        if budget_bytes < 0:
            raise ValueError("budget must be >= 0")
        self.s.budget_bytes = budget_bytes
        memset(self.s.wanted, 0, self.s.n_expert)
        evict_until(self.s, 0, -1)

    def evict_all(self):
        """Drop every resident expert (the next use reads it again)."""
        while self.s.head >= 0:
            evict(self.s, self.s.head)

    def resident_entries(self):
        """Resident ``(layer, expert)`` entries, least recently used first."""
        out = []
        cdef int32_t i = self.s.head
        while i >= 0:
            out.append((i // self.s.n_expert, i % self.s.n_expert))
            i = self.s.next[i]
        return out

    def stats(self):
        cdef stream_t * s = self.s
        return {
            "hits": s.hits,
            "misses": s.misses,
            "evictions": s.evictions,
            "rereads": s.rereads,
            "bytes_read": s.bytes_read,
            "requests": s.n_requests,
            "io_s": s.io_s,
            "mgmt_s": s.mgmt_s,
            "resident_bytes": s.resident_bytes,
            "budget_bytes": s.budget_bytes,
            "odirect": s.odirect != 0,
            "lanes": s.n_lanes,
        }

    def fault(self):
        """None, or ``(file_index, offset, errno)`` of the read that failed (sticky)."""
        if not self.s.fault:
            return None
        return (self.s.fault_file, self.s.fault_offset, self.s.fault_errno)
