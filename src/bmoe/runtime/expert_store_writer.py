"""``python -m bmoe.store``'s work: a model's expert store written by llama.cpp's own repack.

A streamed session of the model is opened (a one-entry cache, no usage profile, no store):
its repack tags each routed-expert projection with the template llama.cpp repacks it
through, and those templates write the store (``bmoe.adapters.expert_store_file``). The
store then serves every later streamed run of this model with this llama.cpp on this CPU
(``--expert-store auto``), checked at each start.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from bmoe.adapters.expert_store_file import (
    Progress,
    default_store_path,
    library_key,
    read_manifest,
    repack_mismatch,
    write_store,
)
from bmoe.adapters.expert_streaming import plan_projections
from bmoe.adapters.gguf_layout import TensorLocation, read_layout
from bmoe.adapters.streaming_store import sources_of
from bmoe.adapters.usage_profile_file import model_key
from bmoe.domain.expert_store import ManifestRejected, StoreManifest, manifest_for, refusal
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ExpertStoreError
from bmoe.runtime.session import Session
from bmoe.runtime.session_config import SessionConfig


@attrs.frozen
class StorePlan:
    """What ``python -m bmoe.store`` would write, before it writes: where, how much, and
    whether a store already there serves as it is (``current``)."""

    path: Path
    manifest: StoreManifest
    current: bool
    why_not_current: str = ""


def _session(model: Path) -> Session:
    stream = StreamConfig(enabled=True, cache_mb=1, profile="off", expert_store="off", governor="off")
    return Session.open(SessionConfig(model_path=model, stream=stream))


def _templates(session: Session) -> tuple[dict[str, int], list[tuple[int, int, TensorLocation]], int]:
    """The repack's template of each routed-expert tensor (by name), the projections found,
    the model's expert count."""
    if session.streaming is None:
        raise ExpertStoreError(f"{session.config.model_path} does not stream: {'; '.join(session.notes)}")
    streaming = session.streaming.streaming
    _, found = plan_projections(session.model, streaming.layout)
    templates = {}
    for layer, p, loc in found:
        if template := streaming.streamer.projection_template(layer, p):
            templates[loc.name] = template
    if not templates:
        raise ExpertStoreError(
            "llama.cpp repacks none of this model's experts on this CPU: a store would hold the file's bytes"
        )
    return templates, [f for f in found if f[2].name in templates], session.model.n_expert


def plan_store(model: Path, out: Path | None) -> StorePlan:
    """Where the store of ``model`` goes and what it holds (its manifest), from the header."""
    layout = read_layout(model)
    key = model_key(layout.paths)
    path = out if out is not None else default_store_path(key)
    with _session(model) as session:
        _, found, _ = _templates(session)
    manifest = manifest_for(sources_of(found), key, library_key())
    try:
        kept = read_manifest(path)
        size = path.stat().st_size if kept is not None else 0
    except (OSError, ManifestRejected) as exc:
        return StorePlan(path, manifest, False, str(exc))
    if kept is None:
        return StorePlan(path, manifest, False, "no store there")
    why = refusal(
        kept, model_key=key, library_key=manifest.library_key, sources=sources_of(found), store_size=size
    )
    return StorePlan(path, manifest, not why, why)


def write_model_store(model: Path, path: Path, progress: Progress | None = None) -> StoreManifest:
    """Write the store of ``model`` at ``path`` (and its manifest), then check it as a run
    would; returns its manifest."""
    layout = read_layout(model)
    with _session(model) as session:
        templates, found, n_expert = _templates(session)
        manifest = manifest_for(sources_of(found), model_key(layout.paths), library_key())
        write_store(path, manifest, layout.paths, templates, n_expert, progress)
        why = repack_mismatch(path, manifest, layout.paths, templates, n_expert)
    if why:
        raise ExpertStoreError(f"the store just written does not check out: {why}")
    return manifest
