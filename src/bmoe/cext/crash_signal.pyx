# cython: language_level=3
"""One line on stderr when the process dies of a signal, before it dies.

A kernel bug inside llama.cpp (AMX tiles that fault, an assert that aborts) kills the
process with no word of why: exit 139 and nothing else. ``install`` sets a handler for
SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT that writes ``bmoe: the process died of
<SIGNAL>`` and the text last given to ``set_text`` (the model, the buffer types holding its
weights, the flag that avoids them) to stderr with ``write(2)`` (async-signal-safe: no
allocation, no lock), then puts back the handler that was there before (Python's
faulthandler, or the default) and raises the signal again: the process still dies of it,
with its exit status, core file and any traceback faulthandler writes.
"""

cdef extern from *:
    """
    #include <signal.h>
    #include <string.h>
    #include <unistd.h>

    #define BMOE_CRASH_TEXT 1024
    static char bmoe_crash_text[BMOE_CRASH_TEXT];
    static volatile size_t bmoe_crash_len = 0;
    static struct sigaction bmoe_crash_prev[65];
    static int bmoe_crash_installed = 0;
    static const int bmoe_crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    static const char * const bmoe_crash_names[] = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"};
    #define BMOE_CRASH_N 5
    static const char bmoe_crash_prefix[] = "bmoe: the process died of ";

    static void bmoe_crash_write(const char * s, size_t n) {
        while (n > 0) {
            ssize_t w = write(2, s, n);
            if (w <= 0) return;
            s += w;
            n -= (size_t) w;
        }
    }

    static void bmoe_on_crash(int sig, siginfo_t * info, void * uc) {
        const char * name = "a signal";
        int i;
        (void) info; (void) uc;
        for (i = 0; i < BMOE_CRASH_N; i++) if (bmoe_crash_signals[i] == sig) name = bmoe_crash_names[i];
        bmoe_crash_write(bmoe_crash_prefix, sizeof bmoe_crash_prefix - 1);
        bmoe_crash_write(name, strlen(name));
        bmoe_crash_write(bmoe_crash_text, bmoe_crash_len);
        bmoe_crash_write("\\n", 1);
        sigaction(sig, &bmoe_crash_prev[sig], NULL);
        raise(sig);  /* delivered once this handler returns, to the handler put back */
    }

    static int bmoe_crash_install(void) {
        struct sigaction sa;
        int i;
        if (bmoe_crash_installed) return 0;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = bmoe_on_crash;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        for (i = 0; i < BMOE_CRASH_N; i++) {
            if (sigaction(bmoe_crash_signals[i], &sa, &bmoe_crash_prev[bmoe_crash_signals[i]]) != 0) return -1;
        }
        bmoe_crash_installed = 1;
        return 0;
    }

    static void bmoe_crash_set(const char * text, size_t n) {
        if (n >= BMOE_CRASH_TEXT) n = BMOE_CRASH_TEXT - 1;
        bmoe_crash_len = 0;  /* a crash meanwhile prints the prefix alone */
        memcpy(bmoe_crash_text, text, n);
        bmoe_crash_len = n;
    }
    """
    int bmoe_crash_install()
    void bmoe_crash_set(const char * text, size_t n)

PREFIX = "bmoe: the process died of "
"""How the line begins (the signal's name follows)."""


def install() -> bool:
    """Set the handlers (once per process; later calls do nothing). False where a signal's
    handler could not be set."""
    return bmoe_crash_install() == 0


def set_text(str text) -> None:
    """What follows the signal's name on the line (at most 1,023 bytes)."""
    cdef bytes raw = text.encode("utf-8", "replace")
    bmoe_crash_set(raw, len(raw))
