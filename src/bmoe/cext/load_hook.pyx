# cython: language_level=3
"""Keep llama.cpp's model load from reading the whole file: its ``mmap`` without populate.

llama.cpp maps a GGUF with ``MAP_POPULATE`` and advises ``WILLNEED`` over all of it while
it loads (``llama_model_load_from_file``), whatever ``load_mode`` says: the kernel then
reads every byte of the file, the routed experts too, before the load returns. Streamed,
bmoe reads the experts itself, so that read is wasted: a 17 GB model read at every start,
and on a small-RAM device the page cache it fills pushes out other processes' pages.

This module redirects the calls libllama makes to ``mmap``, ``posix_madvise`` and
``madvise``, in libllama's own relocation slots (its GOT: the place the dynamic linker
wrote the C library's addresses; nothing of llama.cpp's code or data is touched), to
wrappers that, while ``set_active(True)``, drop ``MAP_POPULATE`` and ignore ``WILLNEED``
advice; otherwise they pass each call through unchanged. Pages are then read when they are
first used: the dense weights as the load copies or uses them, the experts as bmoe streams
them. The assumption this rests on (libllama calls these three through its GOT) is checked
by a gate: ``install`` says how many slots it redirected, and a load with the hook reads
less than the file (``tests/gates/test_load_hook_gates.py``).

Linux ELF, 64-bit (glibc and bionic): elsewhere ``install`` finds nothing and returns 0.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport strcmp, strstr


cdef extern from "sys/mman.h" nogil:
    void * mmap(void * addr, size_t length, int prot, int flags, int fd, long offset)
    int madvise(void * addr, size_t length, int advice)
    int posix_madvise(void * addr, size_t length, int advice)
    int mprotect(void * addr, size_t length, int prot)
    int MAP_POPULATE
    int MADV_WILLNEED
    int POSIX_MADV_WILLNEED
    int PROT_READ
    int PROT_WRITE


cdef extern from "unistd.h" nogil:
    long sysconf(int name)
    int _SC_PAGESIZE


cdef extern from "link.h" nogil:
    ctypedef struct Elf64_Phdr:
        uint32_t p_type
        uint64_t p_vaddr
        uint64_t p_memsz

    ctypedef struct Elf64_Dyn:
        int64_t d_tag
        uint64_t d_val "d_un.d_val"

    ctypedef struct Elf64_Rela:
        uint64_t r_offset
        uint64_t r_info

    ctypedef struct Elf64_Sym:
        uint32_t st_name

    struct dl_phdr_info:
        uintptr_t dlpi_addr
        const char * dlpi_name
        const Elf64_Phdr * dlpi_phdr
        unsigned short dlpi_phnum

    int dl_iterate_phdr(int (*callback)(dl_phdr_info *, size_t, void *) noexcept nogil, void * data)

    int PT_DYNAMIC
    int PT_GNU_RELRO
    int DT_NULL
    int DT_JMPREL
    int DT_PLTRELSZ
    int DT_RELA
    int DT_RELASZ
    int DT_SYMTAB
    int DT_STRTAB


cdef volatile int active = 0
cdef int64_t populate_dropped = 0
cdef int64_t willneed_dropped = 0


cdef void * hook_mmap(void * addr, size_t length, int prot, int flags, int fd, long offset) noexcept nogil:
    global populate_dropped
    if active and flags & MAP_POPULATE:
        flags &= ~MAP_POPULATE
        populate_dropped += 1
    return mmap(addr, length, prot, flags, fd, offset)


cdef int hook_posix_madvise(void * addr, size_t length, int advice) noexcept nogil:
    global willneed_dropped
    if active and advice == POSIX_MADV_WILLNEED:
        willneed_dropped += 1
        return 0
    return posix_madvise(addr, length, advice)


cdef int hook_madvise(void * addr, size_t length, int advice) noexcept nogil:
    global willneed_dropped
    if active and advice == MADV_WILLNEED:
        willneed_dropped += 1
        return 0
    return madvise(addr, length, advice)


ctypedef struct search_t:
    const char * name_part
    int objects            # loaded objects whose path holds name_part
    int redirected         # slots now pointing at a wrapper (this call or an earlier one)
    int failed             # slots found but not writable


cdef uintptr_t absolute(uintptr_t base, uint64_t value) noexcept nogil:
    """A dynamic-section address: glibc has already added the load base, bionic has not."""
    return <uintptr_t> value if value >= base else base + <uintptr_t> value


cdef void * wrapper_for(const char * name) noexcept nogil:
    if strcmp(name, b"mmap") == 0 or strcmp(name, b"mmap64") == 0:
        return <void *> hook_mmap
    if strcmp(name, b"posix_madvise") == 0:
        return <void *> hook_posix_madvise
    if strcmp(name, b"madvise") == 0:
        return <void *> hook_madvise
    return NULL


cdef int in_relro(dl_phdr_info * info, uintptr_t slot) noexcept nogil:
    cdef int i
    cdef uintptr_t start
    for i in range(info.dlpi_phnum):
        if info.dlpi_phdr[i].p_type == PT_GNU_RELRO:
            start = info.dlpi_addr + <uintptr_t> info.dlpi_phdr[i].p_vaddr
            if start <= slot < start + <uintptr_t> info.dlpi_phdr[i].p_memsz:
                return 1
    return 0


cdef void redirect(search_t * s, dl_phdr_info * info, const Elf64_Rela * rel, size_t n,
                   const Elf64_Sym * symtab, const char * strtab) noexcept nogil:
    cdef size_t i
    cdef void * wrapper
    cdef void ** slot
    cdef uintptr_t page_size = <uintptr_t> sysconf(_SC_PAGESIZE)
    cdef uintptr_t page
    cdef int relro
    for i in range(n):
        wrapper = wrapper_for(strtab + symtab[rel[i].r_info >> 32].st_name)
        if wrapper == NULL:
            continue
        slot = <void **> (info.dlpi_addr + <uintptr_t> rel[i].r_offset)
        if slot[0] == wrapper:
            s.redirected += 1
            continue
        page = (<uintptr_t> slot) & ~(page_size - 1)
        relro = in_relro(info, <uintptr_t> slot)
        if relro and mprotect(<void *> page, page_size, PROT_READ | PROT_WRITE) != 0:
            s.failed += 1
            continue
        slot[0] = wrapper
        if relro:
            mprotect(<void *> page, page_size, PROT_READ)
        s.redirected += 1


cdef int visit(dl_phdr_info * info, size_t size, void * data) noexcept nogil:
    cdef search_t * s = <search_t *> data
    cdef int i
    cdef const Elf64_Dyn * dyn = NULL
    cdef uintptr_t base = info.dlpi_addr
    cdef uintptr_t jmprel = 0, rela = 0, symtab = 0, strtab = 0
    cdef size_t pltrelsz = 0, relasz = 0
    if info.dlpi_name == NULL or strstr(info.dlpi_name, s.name_part) == NULL:
        return 0
    for i in range(info.dlpi_phnum):
        if info.dlpi_phdr[i].p_type == PT_DYNAMIC:
            dyn = <const Elf64_Dyn *> (base + <uintptr_t> info.dlpi_phdr[i].p_vaddr)
    if dyn == NULL:
        return 0
    s.objects += 1
    while dyn.d_tag != DT_NULL:
        if dyn.d_tag == DT_JMPREL:
            jmprel = absolute(base, dyn.d_val)
        elif dyn.d_tag == DT_PLTRELSZ:
            pltrelsz = <size_t> dyn.d_val
        elif dyn.d_tag == DT_RELA:
            rela = absolute(base, dyn.d_val)
        elif dyn.d_tag == DT_RELASZ:
            relasz = <size_t> dyn.d_val
        elif dyn.d_tag == DT_SYMTAB:
            symtab = absolute(base, dyn.d_val)
        elif dyn.d_tag == DT_STRTAB:
            strtab = absolute(base, dyn.d_val)
        dyn += 1
    if symtab == 0 or strtab == 0:
        return 0
    if jmprel:
        redirect(s, info, <const Elf64_Rela *> jmprel, pltrelsz // sizeof(Elf64_Rela),
                 <const Elf64_Sym *> symtab, <const char *> strtab)
    if rela:  # an address taken (GLOB_DAT), or a library bound at load (-z now) without a PLT
        redirect(s, info, <const Elf64_Rela *> rela, relasz // sizeof(Elf64_Rela),
                 <const Elf64_Sym *> symtab, <const char *> strtab)
    return 0


def install(bytes name_part=b"libllama") -> int:
    """Redirect ``mmap``, ``posix_madvise`` and ``madvise`` in every loaded object whose path
    holds ``name_part`` (llama-cpp-python loads ``libllama.so`` at import) to the wrappers;
    returns how many slots point at them now (0: nothing found, the load reads as before).
    Idempotent. The wrappers pass every call through until ``set_active(True)``."""
    cdef search_t s
    if sizeof(void *) != 8:  # the ELF structures above are the 64-bit ones
        return 0
    s.name_part = name_part
    s.objects = 0
    s.redirected = 0
    s.failed = 0
    dl_iterate_phdr(visit, &s)
    return s.redirected


def set_active(bint on) -> None:
    """While on, libllama's maps are not populated and its WILLNEED advice is ignored."""
    global active
    active = 1 if on else 0


def stats() -> dict:
    """``{"populate_dropped": n, "willneed_dropped": n}``: the calls changed so far."""
    return {"populate_dropped": populate_dropped, "willneed_dropped": willneed_dropped}
