"""The AMX probe: the tile instructions run in a child process, the answer cached.

``probe_amx()`` starts ``python -m bmoe.adapters.cpu_features``, which asks Linux for the
tile state and executes ``bmoe.cext.cpu_probe.run_amx_tiles`` (configure, load, one int8
tile product, store, release, compare). A child that exits 0 proves AMX works; one that
dies of a signal (SIGILL, SIGSEGV) or computes a wrong product proves it does not, and
the parent lives on. The verdict is cached per machine and llama.cpp version in
``cpu-probe.json`` under bmoe's cache root (:mod:`bmoe.adapters.cache_dirs`): a probe costs
one short process, once.

Where the child cannot run at all (no ``fork``/``exec``, a timeout), the verdict is "not
usable" and says so: refusing AMX costs some speed, using a faulting AMX costs the process.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

from bmoe.adapters.cache_dirs import probe_verdict_file
from bmoe.domain.cpu_features import AmxVerdict

PROBE_VERSION = 1
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


def machine_key() -> str:
    """What the verdict depends on: this CPU, this kernel, this llama.cpp, this probe."""
    try:
        from importlib.metadata import version

        llama = version("llama-cpp-python")
    except Exception:
        llama = "unknown"
    text = "\n".join(
        [_cpu_text(), platform.release(), platform.machine(), llama, str(PROBE_VERSION), sys.executable]
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


def probe_amx(*, cached: bool = True) -> AmxVerdict:
    """The verdict for this machine: from the cache where this machine's key has one, else
    probed now and cached (a cache that cannot be written only costs a probe next time)."""
    path = probe_verdict_file()
    key = machine_key()
    if cached:
        try:
            entry = json.loads(path.read_text())[key]
            return AmxVerdict(usable=bool(entry["usable"]), why=str(entry["why"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    verdict = run_probe()
    try:
        table = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    table[key] = {"usable": verdict.usable, "why": verdict.why}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    except OSError:
        pass
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
