"""The expert store: a model's routed experts written once in the layout llama.cpp computes
with (its ``CPU_REPACK`` form), so that a streamed read lands as it is read.

Streaming from the model file, each expert projection is read in the file's layout and
repacked by llama.cpp as it lands (``ggml_backend_tensor_set`` on a ``CPU_REPACK`` tensor):
CPU on the read lanes, beside the compute threads, for every MiB read. The store holds the
same projections already repacked by that same call, so a read goes straight into the
slice's pages (``O_DIRECT``) and nothing is rearranged on the way.

The policy here, pure: where each tensor sits in the store (``lay_out``: at an offset
congruent with its offset in the model file modulo a page, so that the slices' addresses in
memory, which llama.cpp's mapping makes congruent with the file's offsets, are congruent with
the store's too: the read lands in place), what a store's manifest says (``StoreManifest``),
when one must not be used (``refusal``) and which slices are repacked again at every start
to check that this llama.cpp on this CPU still writes those bytes (``sample_slices``).

Nothing is written without the user's say: ``python -m bmoe.store`` writes a store, and a
streamed session uses one (``--expert-store auto``, the default) only where it exists and
checks out (docs/streaming.md, "The expert store").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

STORE_VERSION = 1
PAGE = 4096
SAMPLED_TENSORS = 8
"""Tensors whose slice is repacked again and compared at each start (the first, the last and
evenly between): a few MiB read, a few ms of repack."""


@attrs.frozen
class SourceTensor:
    """A routed-expert tensor as the model file holds it: ``file_index`` (its shard),
    ``offset`` and ``n_bytes`` there, ``n_expert`` slices of ``n_bytes / n_expert``."""

    name: str
    file_index: int
    offset: int
    n_bytes: int


@attrs.frozen
class StoredTensor:
    """One tensor in the store: at ``store_offset``, the same ``n_bytes`` as in the model file
    (llama.cpp's repacked layout takes the bytes it repacks), from ``source`` there."""

    name: str
    store_offset: int
    n_bytes: int
    file_index: int
    source_offset: int

    @property
    def end(self) -> int:
        return self.store_offset + self.n_bytes


@attrs.frozen
class StoreManifest:
    """What a store holds and for what: the model (``model_key``, the content key the usage
    profile uses), the llama.cpp build that repacked it (``library_key``), the tensors and
    the store's size."""

    model_key: str
    library_key: str
    store_bytes: int
    tensors: tuple[StoredTensor, ...]
    version: int = STORE_VERSION
    page: int = PAGE

    def tensor_at(self, offset: int) -> str:
        """The name of the tensor holding byte ``offset`` of the store ("" for none)."""
        for t in self.tensors:
            if t.store_offset <= offset < t.end:
                return t.name
        return ""

    def by_name(self) -> dict[str, StoredTensor]:
        return {t.name: t for t in self.tensors}


def lay_out(sources: Sequence[SourceTensor], page: int = PAGE) -> tuple[tuple[StoredTensor, ...], int]:
    """Each tensor in order, at the first offset after the one before whose remainder modulo
    ``page`` is its offset's in the model file; the store's size (a whole number of pages)."""
    placed: list[StoredTensor] = []
    at = 0
    for src in sources:
        start = at + (src.offset - at) % page
        placed.append(StoredTensor(src.name, start, src.n_bytes, src.file_index, src.offset))
        at = start + src.n_bytes
    return tuple(placed), -(-at // page) * page


def manifest_for(sources: Sequence[SourceTensor], model_key: str, library_key: str) -> StoreManifest:
    """The manifest of a store of ``sources`` written now."""
    tensors, size = lay_out(sources)
    return StoreManifest(model_key=model_key, library_key=library_key, store_bytes=size, tensors=tensors)


def refusal(
    manifest: StoreManifest,
    *,
    model_key: str,
    library_key: str,
    sources: Sequence[SourceTensor],
    store_size: int,
) -> str:
    """Why this store must not serve this model here ("" when it may, pending the repack
    check): another model file, another llama.cpp build, another format, tensors that are
    not the model's, or a file of another size than written. The model's tensors the store
    lacks (llama.cpp repacks none of their type here) are read from the model file."""
    if manifest.version != STORE_VERSION or manifest.page != PAGE:
        return f"written by another bmoe (store format {manifest.version}, this bmoe reads {STORE_VERSION})"
    if manifest.model_key != model_key:
        return "written for another model file (or this one before it changed)"
    if manifest.library_key != library_key:
        return "written by another llama.cpp build (its repacked layout may differ): write it again"
    model = {src.name: src for src in sources}
    for t in manifest.tensors:
        src = model.get(t.name)
        if src is None:
            return f"its {t.name} is not a routed-expert tensor of this model"
        if t.n_bytes != src.n_bytes or t.source_offset != src.offset or t.file_index != src.file_index:
            return f"its {t.name} is not the model's"
    if store_size != manifest.store_bytes:
        return (
            f"the file is {store_size:,} bytes where {manifest.store_bytes:,} were written (cut or replaced)"
        )
    return ""


def sample_slices(
    manifest: StoreManifest, names: Sequence[str], n_expert: int
) -> list[tuple[StoredTensor, int]]:
    """The ``(tensor, expert)`` slices checked at each start: of the tensors among ``names``
    (the ones this run reads from the store), ``SAMPLED_TENSORS`` evenly spaced (the first
    and the last among them), each at a different expert."""
    stored = manifest.by_name()
    chosen = [stored[n] for n in names if n in stored]
    if not chosen:
        return []
    k = min(SAMPLED_TENSORS, len(chosen))
    picks = sorted({round(i * (len(chosen) - 1) / max(1, k - 1)) for i in range(k)})
    return [(chosen[i], (i * 37 + 11) % n_expert) for i in picks]


def to_document(manifest: StoreManifest) -> dict[str, Any]:
    return {
        "version": manifest.version,
        "page": manifest.page,
        "model_key": manifest.model_key,
        "library_key": manifest.library_key,
        "store_bytes": manifest.store_bytes,
        "tensors": [attrs.asdict(t) for t in manifest.tensors],
    }


class ManifestRejected(ValueError):
    """A manifest that does not read as one (the store is then not used)."""


def from_document(doc: Mapping[str, Any]) -> StoreManifest:
    """The manifest ``doc`` holds; ``ManifestRejected`` naming what is wrong."""
    try:
        tensors = tuple(
            StoredTensor(
                name=str(t["name"]),
                store_offset=int(t["store_offset"]),
                n_bytes=int(t["n_bytes"]),
                file_index=int(t["file_index"]),
                source_offset=int(t["source_offset"]),
            )
            for t in doc["tensors"]
        )
        return StoreManifest(
            model_key=str(doc["model_key"]),
            library_key=str(doc["library_key"]),
            store_bytes=int(doc["store_bytes"]),
            tensors=tensors,
            version=int(doc["version"]),
            page=int(doc["page"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestRejected(f"not a store manifest ({exc!r})") from exc
