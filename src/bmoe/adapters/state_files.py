"""The prompt cache's disk tier (``--cache-disk DIR``): conversations' states that left
memory, kept as files, so a conversation that comes back after its state was pushed out of
``--cache-ram`` (or after a restart) still costs only its new tokens.

- **Where**: ``DIR/<identity>/<tokens' hash>.state``. The identity is a hash of the model's
  content key (:func:`bmoe.adapters.usage_profile_file.model_key`) and of what shapes a
  state (llama.cpp's version, the cache's types, the context's layout): a state made by
  another model, or for another context, lives in another folder and is never looked at.
- **A file**: a magic line, the format's version, the identity, the tokens the state
  follows, the state's bytes (their length first), then a SHA-256 of everything before it.
  Written by bmoe's one rule (:mod:`bmoe.adapters.file_writes`: a temporary file beside it,
  flushed, renamed over, the folder flushed): a crash or a power cut leaves the old file or
  the new one, and a torn one never passes the length and checksum.
- **A disk that fails** (full, read-only, an I/O error): a state that cannot be written is
  not kept, with one warning line, and the tier backs off before trying again
  (``WriteHealth``), saying when writes work again; never a request's error. A folder that
  cannot be made or written at start raises ``FileNotKeptError`` (the session goes on
  without the tier).
- **Trust**: the folder is read once at start (the headers only) into an index; a file is
  read whole and checked only when a prompt wants its state. One whose checksum, magic,
  version or identity is wrong (corrupt, truncated, copied from elsewhere), or that cannot
  be read (an I/O error), is refused by name with a warning, removed, and never restored:
  the prompt is prefilled. Temporary files a killed writer left are swept at start.
- **Room**: at most ``limit_bytes`` of files; the least recently used (a file's mtime,
  touched when read) go first. A state bigger than the limit alone is not written.
- **Several processes** may share the folder: a file another one removed is simply gone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from bmoe.adapters.file_writes import CacheWrites, make_folder, not_kept, sweep_temporaries
from bmoe.domain.decide.prefix_cache import StateBlob

MAGIC = b"BMOE-STATE\n"
VERSION = 1
SUFFIX = ".state"
DIGEST = 32
STALE_TEMPORARY_S = 600.0  # a temporary file this old is a killed writer's, not one in flight
DEFAULT_CACHE_DISK_MIB = 4096
"""``--cache-disk-mb``'s default: room for many long conversations on a phone's flash."""
_HEAD = struct.Struct("<I32sI")  # version, identity, token count


def state_identity(model_key: str, shape: Sequence[object]) -> str:
    """The folder name for states of the model ``model_key`` made by a context of ``shape``
    (llama.cpp's version, the cache's types, its layout): 32 hex digits."""
    digest = hashlib.sha256(b"bmoe-state-identity-1")
    digest.update(model_key.encode())
    for item in shape:
        digest.update(repr(item).encode() + b"\0")
    return digest.hexdigest()[:32]


def _name(tokens: tuple[int, ...]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:40] + SUFFIX


@attrs.define
class _File:
    path: Path
    nbytes: int


class StateFiles:
    """The disk tier: ``StateSpill`` (:mod:`bmoe.domain.prompt_cache`) over a folder.
    ``warn`` receives a line for every file refused and for the disk failing (once per run
    of failures). Raises ``FileNotKeptError`` where the folder cannot be made or written."""

    def __init__(
        self, root: Path, identity: str, limit_bytes: int, warn: Callable[[str], None] | None = None
    ) -> None:
        if limit_bytes < 0:
            raise ValueError("the disk tier's limit must be >= 0 bytes")
        self.dir = Path(root) / identity
        self.identity = bytes.fromhex(identity).ljust(DIGEST, b"\0")
        self.limit_bytes = limit_bytes
        self.warn = warn or (lambda line: None)
        self.refused = 0  # files refused (corrupt, foreign) and removed
        self._lock = threading.Lock()
        self.writes = CacheWrites(self.warn)
        make_folder(self.dir, "the prompt cache's states")
        if not os.access(self.dir, os.W_OK):
            code = errno.EROFS if _read_only(self.dir) else errno.EACCES
            raise not_kept(OSError(code, os.strerror(code)), self.dir, "the prompt cache's states")
        sweep_temporaries(self.dir, STALE_TEMPORARY_S)
        self._index: dict[tuple[int, ...], _File] = {}
        for path in sorted(self.dir.glob("*" + SUFFIX), key=_mtime):
            tokens = self._read_head(path)
            if tokens is not None:
                with contextlib.suppress(FileNotFoundError):
                    self._index[tokens] = _File(path, path.stat().st_size)
        self._fit()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(f.nbytes for f in self._index.values())

    def held(self) -> list[tuple[int, ...]]:
        with self._lock:
            return list(self._index)

    def put(self, tokens: tuple[int, ...], blob: StateBlob) -> None:
        size = _file_size(len(tokens), blob.nbytes)
        if size > self.limit_bytes:
            return
        with self._lock:
            held = self._index.get(tokens)
            if held is not None and held.nbytes == size and held.path.exists():
                with contextlib.suppress(OSError):  # a read-only disk: the order is only LRU's
                    os.utime(held.path)  # the same state (read back from here): just used
                return
        body = self._encode(tokens, blob)
        path = self.dir / _name(tokens)
        if not self.writes.keep(path, body, f"the state after {len(tokens)} tokens ({len(body):,} bytes)"):
            return
        with self._lock:
            self._index[tokens] = _File(path, len(body))
            self._fit()

    def take(self, tokens: tuple[int, ...]) -> StateBlob | None:
        with self._lock:
            held = self._index.get(tokens)
        if held is None:
            return None
        try:
            data = held.path.read_bytes()
        except FileNotFoundError:  # another process removed it
            self.drop(tokens)
            return None
        except OSError as exc:  # an I/O error: a cache miss, never the request's error
            self._refuse(held.path, f"unreadable: {exc.strerror or exc}")
            self.drop(tokens)
            return None
        blob, why = self._decode(data, tokens)
        if blob is None:
            self._refuse(held.path, why)
            self.drop(tokens)
            return None
        with contextlib.suppress(OSError):
            os.utime(held.path)
        return blob

    def drop(self, tokens: tuple[int, ...]) -> None:
        with self._lock:
            held = self._index.pop(tokens, None)
        if held is not None:
            _remove(held.path)

    def _fit(self) -> None:
        """Remove least recently used files until within the limit (the lock held)."""
        total = sum(f.nbytes for f in self._index.values())
        for tokens in sorted(self._index, key=lambda t: _mtime(self._index[t].path)):
            if total <= self.limit_bytes:
                break
            gone = self._index.pop(tokens)
            _remove(gone.path)
            total -= gone.nbytes

    def _encode(self, tokens: tuple[int, ...], blob: StateBlob) -> bytes:
        ids = np.asarray(tokens, dtype="<i4").tobytes()
        head = MAGIC + _HEAD.pack(VERSION, self.identity, len(tokens)) + ids
        body = head + struct.pack("<Q", blob.nbytes) + np.ascontiguousarray(blob).tobytes()
        return body + hashlib.sha256(body).digest()

    def _decode(self, data: bytes, tokens: tuple[int, ...]) -> tuple[StateBlob | None, str]:
        """The state in ``data`` (the whole file), or None and why it is refused."""
        if len(data) < len(MAGIC) + _HEAD.size + 8 + DIGEST:
            return None, "truncated"
        body, digest = data[:-DIGEST], data[-DIGEST:]
        if hashlib.sha256(body).digest() != digest:
            return None, "checksum mismatch (corrupt or truncated)"
        found = self._parse_head(body)
        if isinstance(found, str):
            return None, found
        if found != tokens:
            return None, "its tokens are not its name's"
        at = len(MAGIC) + _HEAD.size + 4 * len(tokens)
        (n,) = struct.unpack_from("<Q", body, at)
        if _file_size(len(tokens), n) != len(data):
            return None, "its length does not add up"
        blob = np.frombuffer(body, dtype=np.uint8, count=n, offset=at + 8).copy()
        blob.flags.writeable = False
        return blob, ""

    def _parse_head(self, data: bytes) -> tuple[int, ...] | str:
        """The tokens a file's head names, or why it is refused."""
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _HEAD.size:
            return "not a bmoe state file"
        version, identity, n = _HEAD.unpack_from(data, len(MAGIC))
        if version != VERSION:
            return f"format version {version}, this bmoe writes {VERSION}"
        if identity != self.identity:
            return "made for another model or context"
        ids = data[len(MAGIC) + _HEAD.size : len(MAGIC) + _HEAD.size + 4 * n]
        if len(ids) != 4 * n:
            return "truncated"
        return tuple(int(t) for t in np.frombuffer(ids, dtype="<i4"))

    def _read_head(self, path: Path) -> tuple[int, ...] | None:
        """The tokens ``path`` follows (its head only); None (refused, removed) for a file
        that is not one of this folder's states."""
        try:
            with open(path, "rb") as f:
                head = f.read(len(MAGIC) + _HEAD.size)
                if len(head) == len(MAGIC) + _HEAD.size and head.startswith(MAGIC):
                    (n,) = struct.unpack_from("<I", head, len(head) - 4)
                    head += f.read(4 * min(n, 1 << 24))
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._refuse(path, f"unreadable: {exc.strerror or exc}")
            return None
        found = self._parse_head(head)
        if isinstance(found, str):
            self._refuse(path, found)
            return None
        if path.name != _name(found):
            self._refuse(path, "its tokens are not its name's")
            return None
        return found

    def _refuse(self, path: Path, why: str) -> None:
        self.refused += 1
        _remove(path)
        self.warn(f"bmoe: prompt cache: refused {path} ({why}); removed, its prompt will be prefilled")


def _file_size(n_tokens: int, n_bytes: int) -> int:
    """The bytes of a file holding a state of ``n_bytes`` after ``n_tokens`` tokens."""
    return len(MAGIC) + _HEAD.size + 4 * n_tokens + 8 + n_bytes + DIGEST


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _remove(path: Path) -> None:
    """Remove one of the tier's files; one that cannot be removed (a read-only disk) stays."""
    with contextlib.suppress(OSError):
        path.unlink()


def _read_only(folder: Path) -> bool:
    return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
