"""Usage profile files (``--profile``): where they live, which model they belong to, and
reading and merging them safely.

- **Which model**: the key is a hash of what identifies the model's *content*: each file's
  size, its first 4 MiB (the GGUF header: metadata and tensor table) and 32 blocks of 4 KiB
  spread over its data. A renamed or copied file keeps its profile; two models with the same
  header but other weights (two seeds of one shape) do not share one. Reading it costs a few
  milliseconds.
- **Where**: ``--profile auto`` is ``<dir>/<key>.json`` with ``<dir>`` ``$BMOE_PROFILE_DIR``,
  else ``profiles/`` under bmoe's cache root (:mod:`bmoe.adapters.cache_dirs`); ``--profile
  FILE`` is that file.
- **Reading**: a missing file is no profile; a corrupt, truncated, foreign or other-version
  one is ignored with the reason (``ProfileRejected``), never trusted.
- **Merging**: processes that share a profile merge into it one at a time (an exclusive
  ``flock`` on ``<file>.lock``): read what is there, apply this process's news, write it by
  bmoe's one rule (:mod:`bmoe.adapters.file_writes`: a temporary file beside it, flushed,
  renamed over; a crash leaves the old or the new file, never half of one). A disk that
  fails raises ``FileNotKeptError`` (the caller backs off and tries again later).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from bmoe.adapters.cache_dirs import profile_dir
from bmoe.adapters.file_writes import exclusive_lock, write_file
from bmoe.domain.streaming.usage_profile import (
    ProfileRejected,
    UsageProfile,
    from_document,
    to_document,
)

HEAD_BYTES = 4 << 20
SAMPLES = 32
SAMPLE_BYTES = 4096
KEY_HEX = 24


def model_key(paths: Sequence[Path]) -> str:
    """The content key of a model made of ``paths`` (its shards in order)."""
    digest = hashlib.sha256(b"bmoe-model-key-1")
    for path in paths:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest.update(size.to_bytes(8, "little"))
            digest.update(f.read(HEAD_BYTES))
            if size > HEAD_BYTES:
                for i in range(SAMPLES):
                    f.seek(HEAD_BYTES + (size - HEAD_BYTES - SAMPLE_BYTES) * i // max(1, SAMPLES - 1))
                    digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()[:KEY_HEX]


def profile_path(setting: str, key: str) -> Path | None:
    """The file of ``--profile setting`` (``off``: None)."""
    if setting == "off":
        return None
    if setting == "auto":
        return profile_dir() / f"{key}.json"
    return Path(setting)


def read_profile(path: Path, key: str, n_layer: int, n_expert: int) -> UsageProfile | None:
    """The profile in ``path`` (None when there is no file); raises ``ProfileRejected`` for
    one not to be trusted, ``OSError`` when the file cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise ProfileRejected("not text") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileRejected("not JSON (corrupt or truncated)") from exc
    return from_document(doc, key, n_layer, n_expert)


Update = Callable[[UsageProfile], UsageProfile]


def update_profile(
    path: Path, key: str, n_layer: int, n_expert: int, update: Update
) -> tuple[UsageProfile, str | None]:
    """Merge into ``path`` under its lock: ``update`` gets the profile there (an empty one
    where there is none, or where the one there is not to be trusted: it is replaced) and
    its result is written atomically. Returns it, with the reason a profile there was
    replaced (else None). Raises ``FileNotKeptError`` when the disk fails (the folder or the
    file cannot be written: nothing changed there), ``OSError`` for other failures."""
    what = f"the usage profile {path.name}"
    with exclusive_lock(path, what):
        replaced = None
        try:
            current = read_profile(path, key, n_layer, n_expert)
        except ProfileRejected as why:
            current, replaced = None, str(why)
        merged = update(current or UsageProfile.empty(key, n_layer, n_expert))
        write_file(path, json.dumps(to_document(merged), separators=(",", ":")), what)
    return merged, replaced
