"""The model's files as a resident session maps them, and whether one was truncated since.

A resident model's weights are llama.cpp's memory mapping of the GGUF file(s). A file
*replaced* or *deleted* under the session is harmless (the mapping keeps the old inode),
but one *truncated* in place makes every later access to the lost pages a ``SIGBUS`` that
kills the process. Checking before each request turns that into a clear fatal error (a
truncation during a request cannot be caught: streaming, which copies the dense weights
into memory of its own, has no such window).
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from bmoe.adapters.gguf_layout import shard_paths


@attrs.frozen
class MappedFiles:
    paths: tuple[Path, ...]
    identities: tuple[tuple[int, int, int], ...]  # (device, inode, size) when opened

    @classmethod
    def snapshot(cls, first: Path) -> MappedFiles:
        paths = tuple(shard_paths(first))
        stats = [os.stat(p) for p in paths]
        return cls(paths, tuple((s.st_dev, s.st_ino, s.st_size) for s in stats))

    def truncated(self) -> str | None:
        """A message when a mapped file (the same inode) is now shorter, else None."""
        for path, (dev, ino, size) in zip(self.paths, self.identities, strict=True):
            try:
                now = os.stat(path)
            except OSError:
                continue  # deleted: the mapping keeps the inode alive
            if (now.st_dev, now.st_ino) == (dev, ino) and now.st_size < size:
                return (
                    f"the model file was truncated under the session ({path}: {now.st_size} of "
                    f"{size} bytes): computing with it would crash the process; open a new session"
                )
        return None
