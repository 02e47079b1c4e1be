"""The model's files as a session opened them, and what has happened to them since.

Two kinds of session care, differently:

- a *resident* session's weights are llama.cpp's memory mapping of the GGUF file(s). A file
  replaced or deleted under it is harmless (the mapping keeps the old inode), but one
  *truncated* in place makes every later access to the lost pages a ``SIGBUS`` that kills
  the process. Checking before each request turns that into a clear fatal error (a
  truncation during a request cannot be caught);
- a *streaming* session reads experts from the path: any change (gone, replaced,
  truncated) means the next read would not read the model it opened.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Literal

import attrs

from bmoe.adapters.gguf_layout import shard_paths

ChangeKind = Literal["gone", "replaced", "truncated"]


@attrs.frozen
class FileChange:
    """What happened to one file: ``size`` is its size now (0 when gone)."""

    path: Path
    kind: ChangeKind
    size: int
    errno: int = 0  # why it cannot be read, when gone


@attrs.frozen
class MappedFiles:
    paths: tuple[Path, ...]
    identities: tuple[tuple[int, int, int], ...]  # (device, inode, size) when opened

    @classmethod
    def snapshot(cls, first: Path) -> MappedFiles:
        paths = tuple(shard_paths(first))
        stats = [os.stat(p) for p in paths]
        return cls(paths, tuple((s.st_dev, s.st_ino, s.st_size) for s in stats))

    def changes(self) -> list[FileChange]:
        """Every file that is gone, replaced (another inode at its path) or truncated (the
        same inode, shorter) since the snapshot."""
        out = []
        for path, (dev, ino, size) in zip(self.paths, self.identities, strict=True):
            try:
                now = os.stat(path)
            except OSError as exc:
                out.append(FileChange(path, "gone", 0, exc.errno or errno.ENOENT))
                continue
            if (now.st_dev, now.st_ino) != (dev, ino):
                out.append(FileChange(path, "replaced", now.st_size))
            elif now.st_size < size:
                out.append(FileChange(path, "truncated", now.st_size))
        return out

    def truncated(self) -> str | None:
        """For a resident session: a message when a mapped file was truncated in place."""
        for change in self.changes():
            if change.kind == "truncated":
                size = self.identities[self.paths.index(change.path)][2]
                return (
                    f"the model file was truncated under the session ({change.path}: {change.size} of "
                    f"{size} bytes): computing with it would crash the process; open a new session"
                )
        return None
