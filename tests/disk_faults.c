/* A disk that fails on purpose, for tests: an LD_PRELOAD shim that makes the C library's
 * file calls fail with a chosen errno for paths under one folder (tests/disk_faults.py
 * builds it with gcc and sets its environment).
 *
 *   BMOE_FAULT_DIR    the folder (absolute): paths under it, and descriptors opened on them
 *   BMOE_FAULT_OPS    which calls fail, comma-separated: open (for writing), openr (for
 *                     reading), write, fsync, rename, read (read, pread and preadv),
 *                     mkdir
 *   BMOE_FAULT_ERRNO  the error number (28 ENOSPC, 30 EROFS, 13 EACCES, 5 EIO)
 *   BMOE_FAULT_WHILE  optional: a file; the faults hold only while it exists (a disk that
 *                     fills and frees itself while the process runs)
 *
 * Like libfiu's posix/io points, but per folder. Calls made with syscall(2) or io_uring
 * pass by it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 65536
static unsigned char tracked[MAX_FD];

static const char *env(const char *name) {
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static int op_on(const char *op) {
    const char *ops = env("BMOE_FAULT_OPS");
    if (!ops) return 0;
    size_t n = strlen(op);
    for (const char *p = ops; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, op, n) == 0) return 1;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static int active(void) {
    const char *flag = env("BMOE_FAULT_WHILE");
    if (!flag) return 1;
    struct stat st;
    int saved = errno;
    int (*real_stat)(const char *, struct stat *) = dlsym(RTLD_NEXT, "stat");
    int on = real_stat ? real_stat(flag, &st) == 0 : 1;
    errno = saved;
    return on;
}

static int under(const char *path) {
    const char *dir = env("BMOE_FAULT_DIR");
    if (!dir || !path) return 0;
    char full[PATH_MAX];
    if (path[0] != '/') {
        if (!getcwd(full, sizeof full)) return 0;
        size_t len = strlen(full);
        if (len + 1 + strlen(path) + 1 > sizeof full) return 0;
        full[len] = '/';
        strcpy(full + len + 1, path);
        path = full;
    }
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static int fail(void) {
    const char *code = env("BMOE_FAULT_ERRNO");
    errno = code ? atoi(code) : EIO;
    return -1;
}

static int fd_faulty(int fd, const char *op) {
    return fd >= 0 && fd < MAX_FD && tracked[fd] && op_on(op) && active();
}

static int path_faulty(const char *path, const char *op) {
    return under(path) && op_on(op) && active();
}

static int opened(int fd, const char *path) {
    if (fd >= 0 && fd < MAX_FD) tracked[fd] = (unsigned char)under(path);
    return fd;
}

static int open_refused(const char *path, int flags) {
    int writing = (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0;
    return path_faulty(path, writing ? "open" : "openr");
}

#define REAL(name) static __typeof__(&name) real_##name; if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

#define OPEN_BODY(name)                                                     \
    mode_t mode = 0;                                                        \
    if (flags & (O_CREAT | O_TMPFILE)) {                                    \
        va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); \
    }                                                                       \
    if (open_refused(path, flags)) return fail();                           \
    REAL(name);                                                     \
    return opened(real_##name(path, flags, mode), path);

int open(const char *path, int flags, ...) { OPEN_BODY(open) }
int open64(const char *path, int flags, ...) { OPEN_BODY(open64) }

#define OPENAT_BODY(name)                                                   \
    mode_t mode = 0;                                                        \
    if (flags & (O_CREAT | O_TMPFILE)) {                                    \
        va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); \
    }                                                                       \
    if (open_refused(path, flags)) return fail();                           \
    REAL(name);                                                   \
    return opened(real_##name(dirfd, path, flags, mode), path);

int openat(int dirfd, const char *path, int flags, ...) { OPENAT_BODY(openat) }
int openat64(int dirfd, const char *path, int flags, ...) { OPENAT_BODY(openat64) }

int close(int fd) {
    REAL(close);
    if (fd >= 0 && fd < MAX_FD) tracked[fd] = 0;
    return real_close(fd);
}

ssize_t write(int fd, const void *buf, size_t n) {
    if (fd_faulty(fd, "write")) return fail();
    REAL(write);
    return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
    if (fd_faulty(fd, "write")) return fail();
    REAL(pwrite);
    return real_pwrite(fd, buf, n, at);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) {
    if (fd_faulty(fd, "write")) return fail();
    REAL(pwrite64);
    return real_pwrite64(fd, buf, n, at);
}

ssize_t writev(int fd, const struct iovec *iov, int n) {
    if (fd_faulty(fd, "write")) return fail();
    REAL(writev);
    return real_writev(fd, iov, n);
}

int fsync(int fd) {
    if (fd_faulty(fd, "fsync")) return fail();
    REAL(fsync);
    return real_fsync(fd);
}

int fdatasync(int fd) {
    if (fd_faulty(fd, "fsync")) return fail();
    REAL(fdatasync);
    return real_fdatasync(fd);
}

ssize_t read(int fd, void *buf, size_t n) {
    if (fd_faulty(fd, "read")) return fail();
    REAL(read);
    return real_read(fd, buf, n);
}

ssize_t pread(int fd, void *buf, size_t n, off_t at) {
    if (fd_faulty(fd, "read")) return fail();
    REAL(pread);
    return real_pread(fd, buf, n, at);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t at) {
    if (fd_faulty(fd, "read")) return fail();
    REAL(pread64);
    return real_pread64(fd, buf, n, at);
}

ssize_t preadv(int fd, const struct iovec *iov, int n, off_t at) {
    if (fd_faulty(fd, "read")) return fail();
    REAL(preadv);
    return real_preadv(fd, iov, n, at);
}

ssize_t preadv64(int fd, const struct iovec *iov, int n, off_t at) {
    if (fd_faulty(fd, "read")) return fail();
    REAL(preadv64);
    return real_preadv64(fd, iov, n, at);
}

int rename(const char *from, const char *to) {
    if ((path_faulty(from, "rename") || path_faulty(to, "rename"))) return fail();
    REAL(rename);
    return real_rename(from, to);
}

int renameat(int fromfd, const char *from, int tofd, const char *to) {
    if ((path_faulty(from, "rename") || path_faulty(to, "rename"))) return fail();
    REAL(renameat);
    return real_renameat(fromfd, from, tofd, to);
}

int mkdir(const char *path, mode_t mode) {
    if (path_faulty(path, "mkdir")) return fail();
    REAL(mkdir);
    return real_mkdir(path, mode);
}
