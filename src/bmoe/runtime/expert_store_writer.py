"""``python -m bmoe.store``'s work: a model's expert store written by llama.cpp's own repack.

A streamed session of the model is opened (a one-entry cache, no usage profile, no store):
its repack tags each routed-expert projection with the template llama.cpp repacks it
through, and those templates write the store (``bmoe.adapters.expert_store_file``). The
store then serves every later streamed run of this model with this llama.cpp on this CPU
(``--expert-store auto``), checked at each start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from bmoe.adapters.expert_store_file import (
    Progress,
    default_store_path,
    kept_store,
    library_key,
    repack_mismatch,
    write_store,
)
from bmoe.adapters.expert_streaming import plan_projections
from bmoe.adapters.gguf_layout import TensorLocation, read_layout
from bmoe.adapters.streaming_store import sources_of
from bmoe.adapters.usage_profile_file import model_key
from bmoe.domain.expert_store import StoreManifest, manifest_for
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ExpertStoreError
from bmoe.runtime.session import Session
from bmoe.runtime.session_config import SessionConfig


@attrs.frozen
class StorePlan:
    """What ``python -m bmoe.store`` would write, before it writes: where, how much, and
    whether a store already there serves as it is (``current``); with what the model open
    (``store_plan``) gives to write it: the repack's template of each tensor (by name), the
    model's files and expert count."""

    path: Path
    manifest: StoreManifest
    current: bool
    why_not_current: str
    templates: Mapping[str, int]
    model_paths: Sequence[Path]
    n_expert: int


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


@contextlib.contextmanager
def store_plan(model: Path, out: Path | None) -> Iterator[StorePlan]:
    """The store of ``model`` (at ``out``, else where ``--expert-store auto`` looks) and what
    it holds, with the model open (once) while the block runs: ``write_model_store`` writes it."""
    layout = read_layout(model)
    key = model_key(layout.paths)
    path = out if out is not None else default_store_path(key)
    with _session(model) as session:
        templates, found, n_expert = _templates(session)
        sources = sources_of(found)
        manifest = manifest_for(sources, key, library_key())
        kept, why = kept_store(path, model_key=key, library_key=manifest.library_key, sources=sources)
        why = why or ("" if kept is not None else "no store there")
        yield StorePlan(path, manifest, not why, why, templates, layout.paths, n_expert)


def write_model_store(plan: StorePlan, progress: Progress | None = None) -> None:
    """Write the planned store (and its manifest), then check it as a run would (inside
    ``store_plan``'s block: its templates live while the model is open)."""
    write_store(plan.path, plan.manifest, plan.model_paths, plan.templates, plan.n_expert, progress)
    why = repack_mismatch(plan.path, plan.manifest, plan.model_paths, plan.templates, plan.n_expert)
    if why:
        raise ExpertStoreError(f"the store just written does not check out: {why}")
