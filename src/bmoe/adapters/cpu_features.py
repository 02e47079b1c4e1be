"""The AMX probe: the tile instructions, then llama.cpp's own AMX kernel, each run in a
child process; the answer cached.

``probe_amx()`` first starts ``python -m bmoe.adapters.cpu_features``, which asks Linux for
the tile state and executes ``bmoe.cext.cpu_probe.run_amx_tiles`` (configure, load, one int8
tile product, store, release, compare): the cheap step, which answers for the CPU. Where the
tiles ran, the kernel step decides (``kernel``: ``bmoe.adapters.amx_kernel``, llama.cpp's
AMX kernel computing a batch with the thread counts asked, against its plain kernels): a
CPU that runs the tiles can still have a llama.cpp whose AMX kernel its compiler broke
(gcc 12, docs/machines.md). A child that dies of a signal (SIGILL, SIGSEGV) or computes
wrong says no, and the parent lives on. The verdict is cached per machine and llama.cpp
*library* in ``cpu-probe.json`` under bmoe's cache root (:mod:`bmoe.adapters.cache_dirs`):
reinstalling llama-cpp-python (another compiler, other flags) probes again.

Where the child cannot run at all (no ``fork``/``exec``, a timeout), the verdict is "not
usable" and says so: refusing AMX costs some speed, using a faulting AMX costs the process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bmoe.adapters.cache_dirs import probe_verdict_file
from bmoe.adapters.file_writes import write_file
from bmoe.domain.amx_kernel import KernelReport, kernel_verdict
from bmoe.domain.cpu_features import AmxVerdict

PROBE_VERSION = 2  # 2: the kernel step, and the library's identity in the key

KernelStep = Callable[[tuple[int, ...]], KernelReport]
"""Runs llama.cpp's AMX kernel with these thread counts (``bmoe.adapters.amx_kernel``)."""
_TIMEOUT_S = 60.0
# the child's exit codes (besides 0: the tiles ran and multiplied right)
_EXIT_NO_PERMISSION = 3
_EXIT_WRONG = 4
_EXIT_UNSUPPORTED = 5


def _cpu_text() -> str:
    """The CPU's model name and feature flags as the kernel lists them ("" if unreadable)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    wanted = ("model name", "flags", "vendor_id", "microcode")
    seen: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in wanted and key not in seen:
            seen[key] = value.strip()
    return "\n".join(f"{k}: {seen.get(k, '')}" for k in wanted)


def llama_library() -> str:
    """The identity of the llama.cpp build that will run: the version, and the path, size and
    modification time of each of its ggml CPU libraries (another compiler or other flags make
    other files); "unknown" where llama-cpp-python cannot be found."""
    try:
        from importlib.metadata import version
        from importlib.util import find_spec

        spec = find_spec("llama_cpp")
        llama = version("llama-cpp-python")
    except Exception:
        return "unknown"
    parts = [llama]
    if spec is not None and spec.origin:
        lib = Path(spec.origin).parent / "lib"
        for path in sorted(lib.glob("libggml-cpu*.so*")) + sorted(lib.glob("libggml-cpu*.dylib")):
            try:
                st = path.stat()
            except OSError:
                continue
            parts.append(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def machine_key(variant: str = "") -> str:
    """What the verdict depends on: this CPU, this kernel, this llama.cpp library, this probe
    (and ``variant``: a fault the tests inject)."""
    text = "\n".join(
        [
            _cpu_text(),
            platform.release(),
            platform.machine(),
            llama_library(),
            str(PROBE_VERSION),
            sys.executable,
            variant,
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _diagnosis() -> str:
    """What the machine claims (CPUID, XCR0), for the verdict's words."""
    from bmoe.cext import cpu_probe

    bits = cpu_probe.amx_cpuid()
    xcr0 = cpu_probe.xcr0()
    cpuid = "CPUID lists AMX-TILE" if bits & cpu_probe.CPUID_AMX_TILE else "CPUID lists no AMX"
    state = "enables" if xcr0 & cpu_probe.XCR0_TILE_DATA else "does not enable"
    return f"{cpuid}; the OS {state} the tile data state (XCR0 {xcr0:#x})"


def run_probe(timeout_s: float = _TIMEOUT_S, *, ask_permission: bool = True) -> AmxVerdict:
    """Run the tile instructions in a child process now (no cache). ``ask_permission``
    False: run them even where Linux refuses the tile state (the tests' way to see a fault
    on a CPU without AMX)."""
    try:
        diagnosis = _diagnosis()
    except ImportError as exc:  # the extension is missing: no probe, no AMX
        return AmxVerdict(usable=False, why=f"bmoe's CPU probe is not built ({exc})")
    command = [sys.executable, "-m", "bmoe.adapters.cpu_features"]
    if not ask_permission:
        command.append("--run-anyway")
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return AmxVerdict(usable=False, why=f"the probe could not run ({exc}); {diagnosis}")
    code = done.returncode
    if code == 0:
        return AmxVerdict(usable=True, why=f"the tile instructions ran and multiplied right; {diagnosis}")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = f"the tile instructions fault on this CPU ({name} in the probe); {diagnosis}"
        return AmxVerdict(usable=False, why=why)
    if code == _EXIT_NO_PERMISSION:
        return AmxVerdict(usable=False, why=f"Linux refused the tile data state (arch_prctl); {diagnosis}")
    if code == _EXIT_WRONG:
        return AmxVerdict(usable=False, why=f"the tile instructions computed a wrong product; {diagnosis}")
    if code == _EXIT_UNSUPPORTED:
        return AmxVerdict(usable=False, why="not an x86-64 Linux machine: no AMX probe")
    return AmxVerdict(usable=False, why=f"the probe exited with status {code}; {diagnosis}")


def probe_amx(
    *,
    cached: bool = True,
    kernel: KernelStep | None = None,
    threads: Sequence[int] = (),
    variant: str = "",
    tiles: AmxVerdict | None = None,
) -> AmxVerdict:
    """The verdict for this machine: from the cache where this machine's key has one (and,
    for a "yes", its kernel step ran every thread count of ``threads``), else probed now and
    cached (a cache that cannot be written only costs a probe next time). Without ``kernel``
    only the tiles are run; with ``tiles``, that is their verdict (the tests' pretence)."""
    path = probe_verdict_file()
    key = machine_key(variant)
    wanted = tuple(sorted(set(threads)))
    if cached:
        try:
            entry = json.loads(path.read_text())[key]
            verdict = AmxVerdict(usable=bool(entry["usable"]), why=str(entry["why"]))
            probed = tuple(int(n) for n in entry.get("threads", ()))
            if not verdict.usable or set(wanted) <= set(probed):
                return verdict
            wanted = tuple(sorted(set(wanted) | set(probed)))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    verdict = tiles if tiles is not None else run_probe()
    if verdict.usable and kernel is not None:
        verdict = kernel_verdict(kernel(wanted), verdict)
    try:
        table = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    table[key] = {"usable": verdict.usable, "why": verdict.why, "threads": list(wanted)}
    with contextlib.suppress(OSError):  # only a cache: probed again next time
        write_file(path, json.dumps(table, indent=1), "the AMX probe's verdict")
    return verdict


def _child(ask_permission: bool) -> int:
    """The child's work: the tile state asked for, then the tiles run (may die here)."""
    from bmoe.cext import cpu_probe

    if not cpu_probe.SUPPORTED:
        return _EXIT_UNSUPPORTED
    if not cpu_probe.request_amx_permission() and ask_permission:
        return _EXIT_NO_PERMISSION
    result = cpu_probe.run_amx_tiles()
    if result == cpu_probe.TILES_OK:
        return 0
    return _EXIT_WRONG if result == cpu_probe.TILES_WRONG else _EXIT_UNSUPPORTED


if __name__ == "__main__":
    # a fault must kill the child plainly, with no core file written for it
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    raise SystemExit(_child(ask_permission="--run-anyway" not in sys.argv[1:]))
