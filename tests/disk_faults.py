"""Disks that fail on purpose, for tests: the fault-injection preload (``disk_faults.c``), a
small tmpfs (a full disk) and a read-only mount.

``fault_env(folder, ops, errno)`` is the environment of a process whose file calls under
``folder`` fail (``open`` for writing, ``openr``, ``write``, ``fsync``, ``rename``, ``read``,
``mkdir``) with ``errno``; ``while_file`` makes the faults hold only while that file exists.
Each helper skips the test, with the reason, where the machine cannot (no gcc, not root, no
``mount``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("disk_faults.c")


def shim() -> Path:
    """The preload library, built once per source (skips without gcc)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("the fault-injection preload needs gcc (or cc) to build")
    out = Path(tempfile.gettempdir()) / f"bmoe-disk-faults-{os.getuid()}-{int(SOURCE.stat().st_mtime)}.so"
    if not out.exists():
        tmp = out.with_name(f"{out.name}.{os.getpid()}")
        proc = subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", "-o", str(tmp), str(SOURCE), "-ldl"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"the fault-injection preload did not build: {proc.stderr[-500:]}")
        os.replace(tmp, out)
    return out


def fault_env(
    folder: Path, ops: str, errno: int, *, while_file: Path | None = None, base: dict[str, str] | None = None
) -> dict[str, str]:
    """``base`` (else this process's environment) with the preload failing ``ops`` under ``folder``."""
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = str(shim())
    env["BMOE_FAULT_DIR"] = str(Path(folder).resolve())
    env["BMOE_FAULT_OPS"] = ops
    env["BMOE_FAULT_ERRNO"] = str(errno)
    if while_file is not None:
        env["BMOE_FAULT_WHILE"] = str(while_file)
    return env


def _mount(*args: str) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs or a read-only folder needs root and mount(8)")
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} is not permitted here: {proc.stderr.strip()}")


def _umount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "64k") -> Iterator[Path]:
    """``folder`` as a tmpfs of ``size`` (a disk that fills), unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    try:
        yield folder
    finally:
        _umount(folder)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` (as it is) bound read-only onto itself (chmod does not stop root)."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(folder), str(folder))
    try:
        _mount("-o", "remount,bind,ro", str(folder))
    except BaseException:
        _umount(folder)
        raise
    try:
        yield folder
    finally:
        _umount(folder)
