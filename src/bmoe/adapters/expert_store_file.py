"""An expert store on disk (``bmoe.domain.expert_store``): where it lives, how it is written
(by llama.cpp's own repack: ``weight_repack.repack_into``, the call the read lanes make), and
the check each start makes (sampled slices repacked again, compared byte for byte).

A store is two files: the slices (``<key>.experts``, under ``<cache root>/expert-stores`` or
where ``--out`` says) and its manifest beside it (``<key>.experts.json``), written after the
slices: a store without its manifest is not a store. Both by the write rule
(``bmoe.adapters.file_writes``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import llama_cpp

from bmoe.adapters.cache_dirs import store_dir
from bmoe.adapters.file_writes import make_folder, replacing, write_file
from bmoe.cext import weight_repack
from bmoe.domain.expert_store import (
    ManifestRejected,
    SourceTensor,
    StoredTensor,
    StoreManifest,
    from_document,
    refusal,
    sample_slices,
    to_document,
)
from bmoe.errors import ExpertStoreError

STORE_SUFFIX = ".experts"
MANIFEST_SUFFIX = ".json"
KEY_HEX = 24

Progress = Callable[[int, int], None]
"""``(bytes written, bytes to write)``."""


def default_store_path(model_key: str) -> Path:
    """Where ``python -m bmoe.store`` writes the store of the model with ``model_key`` and
    where ``--expert-store auto`` looks for it."""
    return store_dir() / f"{model_key}{STORE_SUFFIX}"


def manifest_path(store: Path) -> Path:
    return store.with_name(store.name + MANIFEST_SUFFIX)


def written_store(model_key: str) -> Path | None:
    """The store ``python -m bmoe.store`` wrote for the model with ``model_key`` where
    ``--expert-store auto`` looks (its slices and its manifest there), else None."""
    store = default_store_path(model_key)
    return store if store.is_file() and manifest_path(store).is_file() else None


def library_key() -> str:
    """The llama.cpp build this process loaded: its version and its libraries' names, sizes
    and times (a store repacked by another build is written again, not trusted)."""
    lib = Path(llama_cpp.__file__).parent / "lib"
    digest = hashlib.sha256(f"bmoe-llama-lib-1:{llama_cpp.__version__}".encode())
    for path in sorted(lib.glob("*.so*")):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:KEY_HEX]


def read_manifest(store: Path) -> StoreManifest | None:
    """The manifest beside ``store``; None where there is none. ``ManifestRejected`` for one
    that does not read; ``OSError`` where it cannot be read."""
    try:
        text = manifest_path(store).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise ManifestRejected("not text") from exc
    try:
        return from_document(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ManifestRejected("not JSON (corrupt or cut)") from exc


def kept_store(
    store: Path, *, model_key: str, library_key: str, sources: Sequence[SourceTensor]
) -> tuple[StoreManifest | None, str]:
    """The manifest of the store at ``store`` and why it must not serve this model here ("" when
    it may, pending the repack check: ``refusal``): ``(None, "")`` where there is none,
    ``(None, why)`` where its manifest cannot be read."""
    try:
        manifest = read_manifest(store)
        size = store.stat().st_size if manifest is not None else 0
    except (OSError, ManifestRejected) as exc:
        return None, f"its manifest cannot be read ({exc})"
    if manifest is None:
        return None, ""
    why = refusal(manifest, model_key=model_key, library_key=library_key, sources=sources, store_size=size)
    return manifest, why


@contextlib.contextmanager
def _open_all(paths: Sequence[Path]) -> Iterator[list[int]]:
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


class _Repacker:
    """One slice repacked by llama.cpp into a buffer of its own."""

    def __init__(self, templates: Mapping[str, int], n_expert: int) -> None:
        self._templates = templates
        self._n_expert = n_expert
        self._buffer = ctypes.create_string_buffer(1)
        self._size = 0

    def slice_bytes(self, tensor: StoredTensor) -> int:
        return tensor.n_bytes // self._n_expert

    def repack(self, tensor: StoredTensor, data: bytes) -> memoryview:
        if len(data) > self._size:
            self._buffer = ctypes.create_string_buffer(len(data))
            self._size = len(data)
        weight_repack.repack_into(self._templates[tensor.name], ctypes.addressof(self._buffer), data)
        return memoryview(self._buffer).cast("B")[: len(data)]


def write_store(
    store: Path,
    manifest: StoreManifest,
    model_paths: Sequence[Path],
    templates: Mapping[str, int],
    n_expert: int,
    progress: Progress | None = None,
) -> Path:
    """Write every slice of the manifest's tensors, read from the model's files and repacked
    by llama.cpp through ``templates`` (tensor name -> the template its projection is
    repacked through), then the manifest. ``ExpertStoreError`` where the folder has not the
    room (said before anything is written); ``FileNotKeptError`` for a disk fault on the way
    (nothing left under the store's name)."""
    folder = make_folder(store.parent, "the expert store")
    free = shutil.disk_usage(folder).free
    old = store.stat().st_size if store.is_file() else 0
    if manifest.store_bytes > free + old:
        raise ExpertStoreError(
            f"the expert store needs {manifest.store_bytes / 2**30:.2f} GiB in {folder}, "
            f"{free / 2**30:.2f} GiB are free: free some, or name another folder (--out)"
        )
    repacker = _Repacker(templates, n_expert)
    done = 0
    with replacing(store, "the expert store") as tmp, _open_all(model_paths) as sources:
        out = os.open(tmp, os.O_WRONLY)
        try:
            os.ftruncate(out, manifest.store_bytes)
            for tensor in manifest.tensors:
                size = repacker.slice_bytes(tensor)
                src = sources[tensor.file_index]
                for e in range(n_expert):
                    data = os.pread(src, size, tensor.source_offset + e * size)
                    if len(data) != size:
                        raise ExpertStoreError(f"{tensor.name}: the model file ends inside it")
                    _write_all(out, repacker.repack(tensor, data), tensor.store_offset + e * size)
                done += tensor.n_bytes
                # written pages flushed and dropped: the store does not fill the memory it runs in
                os.fdatasync(out)
                os.posix_fadvise(out, 0, 0, os.POSIX_FADV_DONTNEED)
                os.posix_fadvise(src, tensor.source_offset, tensor.n_bytes, os.POSIX_FADV_DONTNEED)
                if progress is not None:
                    progress(done, manifest.store_bytes)
        finally:
            os.close(out)
    write_file(manifest_path(store), json.dumps(to_document(manifest)), "the expert store's manifest")
    return store


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


def repack_mismatch(
    store: Path,
    manifest: StoreManifest,
    model_paths: Sequence[Path],
    templates: Mapping[str, int],
    n_expert: int,
) -> str:
    """The check of each start: the sampled slices (``sample_slices``) repacked now by this
    llama.cpp on this CPU, against the store's bytes. "" when they agree, else which did not."""
    repacker = _Repacker(templates, n_expert)
    with _open_all(model_paths) as sources, _open_all([store]) as (kept,):
        for tensor, e in sample_slices(manifest, list(templates), n_expert):
            size = repacker.slice_bytes(tensor)
            data = os.pread(sources[tensor.file_index], size, tensor.source_offset + e * size)
            stored = os.pread(kept, size, tensor.store_offset + e * size)
            if len(data) != size or bytes(repacker.repack(tensor, data)) != stored:
                return (
                    f"its {tensor.name} (expert {e}) is not what this llama.cpp writes on this CPU: "
                    "write the store again"
                )
    return ""
