"""Steps 3 and 5 of ``ExpertStreaming.attach`` where an expert store serves the experts
(``bmoe.domain.expert_store``, ``bmoe.adapters.expert_store_file``).

Before the files are opened (``find_store``): the store ``--expert-store`` names (``auto``:
the one ``python -m bmoe.store`` wrote for this model file, if any) and its manifest's
checks: this model file, this llama.cpp build, the model's tensors, its size. After the
repack has tagged the experts (``use_store``): sampled slices repacked again by llama.cpp and
compared with the store's bytes; then each projection the repack would land is read from the
store instead, landing as read. A store that fails a check is not used: with ``auto`` a note
says why and the experts stream from the model file as without one (the same output); a
store named by its path is an ``ExpertStoreError``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from bmoe.adapters.expert_store_file import default_store_path, kept_store, library_key, repack_mismatch
from bmoe.adapters.gguf_layout import TensorLocation
from bmoe.adapters.usage_profile_file import model_key
from bmoe.cext import expert_stream
from bmoe.domain.expert_store import SourceTensor, StoreManifest
from bmoe.errors import ExpertStoreError

AUTO = "auto"
OFF = "off"


@attrs.frozen
class StoreChoice:
    """The store a run will read from (``path`` None: none) and the line that says why."""

    path: Path | None
    manifest: StoreManifest | None
    note: str = ""
    named: bool = False  # the user named it (a refusal is an error)


@attrs.frozen
class StoreUse:
    """What the store serves once checked: ``path`` None where it serves nothing."""

    path: Path | None = None
    manifest: StoreManifest | None = None
    tensors: int = 0
    n_bytes: int = 0
    note: str = ""


def sources_of(found: Sequence[tuple[int, int, TensorLocation]]) -> list[SourceTensor]:
    """The routed-expert tensors as the store lays them out (in the order found)."""
    return [SourceTensor(loc.name, loc.file_index, loc.offset, loc.n_bytes) for _, _, loc in found]


def _refused(choice_path: Path, why: str, named: bool) -> StoreChoice:
    if named:
        raise ExpertStoreError(f"--expert-store {choice_path}: {why}")
    return StoreChoice(None, None, note=f"expert store {choice_path} not used: {why}")


def find_store(
    setting: str, model_paths: Sequence[Path], found: Sequence[tuple[int, int, TensorLocation]]
) -> StoreChoice:
    """The store ``setting`` (``--expert-store``) picks for this model, its manifest checked."""
    if setting == OFF:
        return StoreChoice(None, None)
    named = setting != AUTO
    key = model_key(model_paths)
    path = Path(setting) if named else default_store_path(key)
    manifest, why = kept_store(path, model_key=key, library_key=library_key(), sources=sources_of(found))
    if why:
        return _refused(path, why, named)
    if manifest is None:
        if named:
            raise ExpertStoreError(f"--expert-store {path}: no store there (write one: python -m bmoe.store)")
        return StoreChoice(None, None)
    return StoreChoice(path, manifest, named=named)


def use_store(
    streamer: expert_stream.ExpertStreamer,
    choice: StoreChoice,
    file_index: int,
    model_paths: Sequence[Path],
    found: Sequence[tuple[int, int, TensorLocation]],
    n_expert: int,
) -> StoreUse:
    """Read from the store (open as file ``file_index``) every projection the repack tagged,
    once its sampled slices check out."""
    if choice.path is None or choice.manifest is None:
        return StoreUse(note=choice.note)
    stored = choice.manifest.by_name()
    templates = {}  # the projections the repack tagged that the store holds
    for layer, p, loc in found:
        template = streamer.projection_template(layer, p)
        if template and loc.name in stored:
            templates[loc.name] = template
    if not templates:
        return StoreUse(note=f"expert store {choice.path} not used: the weights are not repacked here")
    try:
        why = repack_mismatch(choice.path, choice.manifest, model_paths, templates, n_expert)
    except OSError as exc:  # the store cannot be read: as a store that does not check out
        why = f"it cannot be read ({exc})"
    if why:
        refused = _refused(choice.path, why, choice.named)
        return StoreUse(note=refused.note)
    n_bytes = 0
    for layer, p, loc in found:
        if loc.name in templates:
            streamer.read_projection_from(layer, p, file_index, stored[loc.name].store_offset)
            n_bytes += loc.n_bytes
    return StoreUse(path=choice.path, manifest=choice.manifest, tensors=len(templates), n_bytes=n_bytes)


def store_size_text(use: StoreUse) -> str:
    """The ``mode:`` line's words for the store in use ("" for none)."""
    if use.path is None:
        return ""
    return f"experts read repacked from the store {os.fspath(use.path)} ({use.n_bytes / 2**20:,.1f} MiB)"
