# Linux and POSIX declarations that Cython's own ``posix.*`` pxds lack (the read lanes'
# files and the overlay's pages).

cdef extern from "fcntl.h" nogil:
    enum:
        O_DIRECT
    int posix_fadvise(int fd, long offset, long length, int advice)
    enum:
        POSIX_FADV_DONTNEED

cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void * iov_base
        size_t iov_len
    long preadv(int fd, const iovec * iov, int iovcnt, long offset)

cdef extern from "string.h" nogil:
    char * strerror(int errnum)

cdef extern from "sys/mman.h" nogil:
    void * mremap(void * old_address, size_t old_size, size_t new_size, int flags, void * new_address)
    enum:
        MREMAP_MAYMOVE
        MREMAP_FIXED

# flags newer than some C libraries' headers: the kernel's values
cdef enum:
    MREMAP_DONTUNMAP_FLAG = 4      # Linux 5.7+ (private anonymous mappings)
    MADV_POPULATE_READ_FLAG = 22   # Linux 5.14+
