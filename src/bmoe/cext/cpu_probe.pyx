# cython: language_level=3
"""CPU features run, not read: the instructions llama.cpp's AMX kernels execute.

A machine may advertise AMX (``cpuid``, ``/proc/cpuinfo``, ``arch_prctl``'s answers) and
still fault on the tile instructions (a VM whose host does not save the tile state). The
only sure test is to execute them: ``run_amx_tiles`` configures three tiles, loads two,
multiplies them (``tdpbssd``: the int8 dot product of llama.cpp's quantized AMX kernels),
stores the result, releases the tiles and compares with the same product computed in
scalar code. Call it only in a process that may die of it (``bmoe.adapters.cpu_features``
runs it in a child): where the tiles fault, the process gets SIGILL or SIGSEGV.

The other functions only read what the machine says (for the diagnosis printed beside the
verdict): ``amx_cpuid`` (CPUID leaf 7 bits), ``xcr0`` (the OS-enabled state components)
and ``request_amx_permission`` (Linux's ``ARCH_REQ_XCOMP_PERM`` for the tile data, which
llama.cpp requests too). On anything but x86-64 Linux with GCC or Clang, ``SUPPORTED`` is
False and the functions answer "no AMX".
"""

cdef extern from *:
    """
    #if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
    #define BMOE_AMX_PROBE 1
    #include <cpuid.h>
    #include <string.h>
    #include <unistd.h>
    #include <sys/syscall.h>
    #include <immintrin.h>

    /* CPUID.(EAX=7,ECX=0):EDX bit 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8 */
    static int bmoe_amx_cpuid(void) {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
        return (int) (((d >> 24) & 1u) | (((d >> 25) & 1u) << 1) | (((d >> 22) & 1u) << 2));
    }

    /* XCR0 (0 where the OS has not enabled XSAVE): bit 17 tile config, bit 18 tile data */
    static unsigned long long bmoe_xcr0(void) {
        unsigned a, b, c, d, lo, hi;
        if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;
        __asm__ volatile ("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        return ((unsigned long long) hi << 32) | lo;
    }

    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): 0 granted, else errno */
    static int bmoe_amx_permission(void) {
        return syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 0 : 1;
    }

    struct bmoe_tile_config {
        unsigned char palette_id;
        unsigned char start_row;
        unsigned char reserved[14];
        unsigned short colsb[16];
        unsigned char rows[16];
    };

    /* 16x64 int8 A times B (16 rows of 64 bytes: K/4 x (N*4), the VNNI layout) into a 16x16
       int32 C; 0 when the tiles' result equals the scalar one, 1 when it differs. */
    __attribute__((target("amx-tile,amx-int8"), noinline))
    static int bmoe_amx_tiles(void) {
        static signed char A[16 * 64] __attribute__((aligned(64)));
        static signed char B[16 * 64] __attribute__((aligned(64)));
        static int C[16 * 16] __attribute__((aligned(64)));
        struct bmoe_tile_config cfg __attribute__((aligned(64)));
        int i, m, n, k, want;
        for (i = 0; i < 16 * 64; i++) {
            A[i] = (signed char) (i % 7 - 3);
            B[i] = (signed char) (i % 5 - 2);
        }
        memset(C, 0, sizeof C);
        memset(&cfg, 0, sizeof cfg);
        cfg.palette_id = 1;
        for (i = 0; i < 3; i++) {
            cfg.colsb[i] = 64;
            cfg.rows[i] = 16;
        }
        _tile_loadconfig(&cfg);
        _tile_zero(0);
        _tile_loadd(1, A, 64);
        _tile_loadd(2, B, 64);
        _tile_dpbssd(0, 1, 2);
        _tile_stored(0, C, 64);
        _tile_release();
        for (m = 0; m < 16; m++) {
            for (n = 0; n < 16; n++) {
                want = 0;
                for (k = 0; k < 64; k++) want += A[m * 64 + k] * B[(k / 4) * 64 + n * 4 + k % 4];
                if (C[m * 16 + n] != want) return 1;
            }
        }
        return 0;
    }
    #else
    #define BMOE_AMX_PROBE 0
    static int bmoe_amx_cpuid(void) { return 0; }
    static unsigned long long bmoe_xcr0(void) { return 0; }
    static int bmoe_amx_permission(void) { return 1; }
    static int bmoe_amx_tiles(void) { return 2; }
    #endif
    """
    int BMOE_AMX_PROBE
    int bmoe_amx_cpuid() nogil
    unsigned long long bmoe_xcr0() nogil
    int bmoe_amx_permission() nogil
    int bmoe_amx_tiles() nogil

SUPPORTED = bool(BMOE_AMX_PROBE)
"""Whether this build can probe AMX at all (x86-64 Linux)."""

CPUID_AMX_TILE = 1
CPUID_AMX_INT8 = 2
CPUID_AMX_BF16 = 4
XCR0_TILE_CONFIG = 1 << 17
XCR0_TILE_DATA = 1 << 18

TILES_OK = 0
TILES_WRONG = 1
TILES_UNSUPPORTED = 2


def amx_cpuid() -> int:
    """The CPU's AMX bits (``CPUID_AMX_*``) as CPUID reports them."""
    return bmoe_amx_cpuid()


def xcr0() -> int:
    """XCR0: the state components the OS enabled (``XCR0_TILE_*``); 0 where unreadable."""
    return <long long> bmoe_xcr0()


def request_amx_permission() -> bool:
    """Ask Linux for the tile data state (what llama.cpp asks before using AMX)."""
    return bmoe_amx_permission() == 0


def run_amx_tiles() -> int:
    """Execute the tile instructions: ``TILES_OK``, ``TILES_WRONG`` (a wrong product) or
    ``TILES_UNSUPPORTED`` (not x86-64 Linux). May kill the process (SIGILL, SIGSEGV)."""
    return bmoe_amx_tiles()
