"""The one rule for every file bmoe writes (docs/reliability.md, "Files bmoe writes").

A file is written to a temporary name in its own folder, flushed to the disk (``fsync``),
renamed over its final name, and the folder flushed too: a crash or a power cut leaves the
old file or the new one, never a complete-looking name over missing bytes. A write that
fails for the disk's sake (``DISK_FAULTS``: no space, a read-only file system, a
permission, an I/O error, the folder gone, a quota) removes its temporary file and raises
one ``FileNotKeptError`` naming the folder, the error and what was not kept; any other
error (a bug of the writer's) also removes it and goes on as it was.

- ``write_file``: bytes or text, or a function that writes into the open file;
- ``replacing``: a ``with`` block that gets the temporary file's path (for writers that
  want a path: gguf-py's ``GGUFWriter``);
- ``staged_folder``: a whole folder built under a temporary name and renamed into place;
- ``make_folder``, ``scratch_folder``: a folder made, a scratch folder removed afterwards;
- ``CacheWrites``: for files that are only a cache, the rule with ``WriteHealth``'s back-off:
  a failure is one warning line, never an error.

``tests/test_file_writes_rule.py`` fails when a module outside this one writes files itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from bmoe.domain.write_health import WriteHealth
from bmoe.errors import FileNotKeptError

DISK_FAULTS = frozenset(
    {
        errno.ENOSPC,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EIO,
        errno.ENOENT,
        errno.EDQUOT,
        errno.ENOTDIR,
    }
)
"""The errors that are the disk's (or the folder's), not the writer's."""

TEMP_PREFIX = ".bmoe-tmp-"
"""Every temporary name starts so: ``sweep_temporaries`` knows them (a writer killed mid-write)."""


def is_disk_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a write failing for the disk's sake (``DISK_FAULTS``)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FAULTS


def not_kept(exc: OSError, folder: Path, what: str) -> FileNotKeptError:
    """The typed error of a disk fault ``exc`` met writing ``what`` in ``folder``."""
    code = exc.errno
    name = errno.errorcode.get(code, "?") if code is not None else "?"
    reason = f"{exc.strerror or exc} ({name})"
    return FileNotKeptError(
        f"cannot write {what} in {folder}: {reason}", folder=str(folder), what=what, errno=code, reason=reason
    )


@contextlib.contextmanager
def faults_named(folder: Path, what: str) -> Iterator[None]:
    """For the block: a disk fault (``is_disk_fault``) becomes ``not_kept``'s typed error
    naming ``folder`` and ``what``; any other error passes as it is."""
    try:
        yield
    except OSError as exc:
        if is_disk_fault(exc):
            raise not_kept(exc, folder, what) from exc
        raise


def flush_folder(folder: Path) -> None:
    """``fsync`` a folder, so that a rename in it survives a power cut."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # file systems that cannot: nothing to do
            raise
    finally:
        os.close(fd)


def _flush_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_folder(folder: Path, what: str) -> Path:
    """``folder`` made (with its parents) where missing; ``FileNotKeptError`` where it cannot be."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if is_disk_fault(exc) or exc.errno == errno.EEXIST:
            raise not_kept(exc, folder, what) from exc
        raise
    return folder


Content = bytes | str | Callable[[IO[Any]], None]


def write_file(path: Path, content: Content, what: str, *, mode: int = 0o644) -> Path:
    """Write ``content`` (bytes, UTF-8 text, or a function given the open binary file) to
    ``path`` by the rule; ``FileNotKeptError`` for a disk fault, nothing left behind."""
    with replacing(path, what, mode=mode) as tmp, open(tmp, "wb") as out:
        if isinstance(content, bytes):
            out.write(content)
        elif isinstance(content, str):
            out.write(content.encode("utf-8"))
        else:
            content(out)
    return Path(path)


@contextlib.contextmanager
def replacing(path: Path, what: str, *, mode: int = 0o644) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; when the block ends it is
    flushed, given ``mode``, renamed over ``path`` and the folder flushed. A disk fault
    (in the block or after) raises ``FileNotKeptError``; any error removes the temporary file."""
    path = Path(path)
    folder = make_folder(path.parent, what)
    tmp: Path | None = None
    try:
        with faults_named(folder, what):
            fd, name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", dir=folder)
            os.close(fd)
            tmp = Path(name)
            yield tmp
            _flush_path(tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
            tmp = None
            flush_folder(folder)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()


@contextlib.contextmanager
def staged_folder(
    final: Path, what: str, *, replace_if: Callable[[Path], bool] | None = None
) -> Iterator[Path]:
    """A temporary folder beside ``final`` for the block to fill; then its files are
    flushed and it is renamed to ``final``. Where ``final`` exists already and
    ``replace_if(final)`` says so (a damaged copy), it is moved aside and removed first;
    where a concurrent writer published ``final`` first, this copy is discarded (the
    caller checks ``final``). Disk faults raise ``FileNotKeptError``."""
    final = Path(final)
    parent = make_folder(final.parent, what)
    staging: Path | None = None
    try:
        with faults_named(parent, what):
            staging = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{final.name}.", dir=parent))
            yield staging
            for item in staging.rglob("*"):
                if item.is_file():
                    _flush_path(item)
            staging.chmod(0o755)  # mkdtemp makes it private; the published folder is readable like any cache
            flush_folder(staging)
            if final.exists() and replace_if is not None and replace_if(final):
                stale = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{final.name}.stale.", dir=parent))
                with contextlib.suppress(FileNotFoundError):  # another process moved it first
                    os.rename(final, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise  # else another process published first: the caller checks ``final``
            if not staging.exists():
                staging = None
                flush_folder(parent)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def scratch_folder(prefix: str, what: str) -> Iterator[Path]:
    """A private folder under the system's temporary folder, removed when the block ends
    (files that are never kept: a model's header read for a plan)."""
    with faults_named(Path(tempfile.gettempdir()), what):
        folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with faults_named(folder, what):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``<path>.lock`` (made where missing) for the block: processes
    that share ``path`` update it one at a time. ``FileNotKeptError`` where it cannot be made."""
    path = Path(path)
    lock_path = path.with_name(path.name + ".lock")
    make_folder(path.parent, what)
    with faults_named(path.parent, what):
        fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with it


def sweep_temporaries(folder: Path, older_than_s: float, now: float | None = None) -> int:
    """Remove this rule's temporary files in ``folder`` older than ``older_than_s`` (left by
    a writer killed mid-write; younger ones may be another process's write in flight).
    Returns how many went; a folder that cannot be read or written is left as it is."""
    now = time.time() if now is None else now
    gone = 0
    with contextlib.suppress(OSError):
        for item in Path(folder).glob(TEMP_PREFIX + "*"):
            with contextlib.suppress(OSError):
                if item.is_file() and now - item.stat().st_mtime >= older_than_s:
                    item.unlink()
                    gone += 1
    return gone


class CacheWrites:
    """Writes of files that are only a cache (a prompt state, a usage profile): by the rule,
    and where the disk fails, ``WriteHealth``'s one warning line (to ``warn``), its back-off
    (writes are not tried while it waits) and its line when writes work again. Never raises
    for the disk's sake. Safe to share between threads."""

    def __init__(
        self,
        warn: Callable[[str], None],
        health: WriteHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.warn = warn
        self.health = health or WriteHealth()
        self.clock = clock
        self._lock = threading.Lock()

    def may_try(self) -> bool:
        """Whether a write would be tried now (False while backing off; counted as not kept)."""
        with self._lock:
            return self.health.may_try(self.clock())

    def keep(self, path: Path, content: Content, what: str) -> bool:
        """Write ``content`` to ``path`` by the rule: True when kept; False when the disk
        failed or the writer is backing off (warned once)."""
        if not self.may_try():
            return False
        try:
            write_file(path, content, what)
        except FileNotKeptError as exc:
            self.failed(exc)
            return False
        self.worked(Path(path).parent)
        return True

    def failed(self, exc: FileNotKeptError) -> None:
        """A disk fault met by a write of this writer's (one warning line per run of them)."""
        with self._lock:
            line = self.health.failed(self.clock(), exc.folder, exc.reason, exc.what)
        if line is not None:
            self.warn(line)

    def worked(self, folder: Path) -> None:
        """A write of this writer's worked (the line saying so after a run of failures)."""
        with self._lock:
            line = self.health.succeeded(str(folder))
        if line is not None:
            self.warn(line)
