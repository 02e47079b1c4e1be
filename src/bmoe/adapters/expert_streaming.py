"""Put a loaded llama.cpp model on expert streaming (see docs/streaming.md).

``ExpertStreaming.attach`` runs once per session, after the context exists, in this order:

1. *capture* (``bmoe.adapters.streaming_capture``): one warm-up decode in capture mode
   records the address of every weight the graph reads; with the GGUF layout this gives, per
   file, the base of llama.cpp's mapping (every weight must agree on it: otherwise the
   weights are not where streaming needs them, and the model stays resident);
2. *overlay* (``bmoe.adapters.dense_overlay``): each file's data region of the mapping is
   replaced by anonymous memory; the dense bytes (everything but routed experts) are copied
   in once, so nothing in use still points into the file, and the experts' pages stay empty
   until a read fills them;
3. *open* (here): the files are opened for the read lanes (``O_DIRECT`` where allowed), the
   engine options resolved for this machine (``ExpertStreaming.engine``) and the budget set;
4. *routers* (``bmoe.adapters.router_gates``), for the decode routing policies that evaluate
   them: each MoE layer's router copied as F32 rows;
5. *repack* (``bmoe.adapters.streaming_repack``, unless ``--no-repack``): the weights
   llama.cpp would repack at load are repacked as it does (``bmoe.adapters.llama.repack``):
   the dense ones moved into a ``CPU_REPACK`` buffer (their overlay pages given back), the
   routed experts' tensors tagged so that the lanes write each expert repacked as they read it;
   where an expert store serves this model (``bmoe.adapters.streaming_store``: found before the
   files are opened in step 3, checked after the repack), the tagged projections are read from
   it instead, already repacked, straight into their slices.

The caller then hands the streamer its setup knobs, the engine options among them, in one
value (``StreamerSettings``, ``ExpertStreamer.configure``) and switches the C callback to the
fast path or to the reference policy (``bmoe.runtime.streaming``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from bmoe.adapters.dense_overlay import overlay_dense
from bmoe.adapters.expert_source import streamer_fault
from bmoe.adapters.gguf_layout import ModelLayout, TensorLocation, read_header_values, read_layout
from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.devices import backend_api
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.model_files import MappedFiles
from bmoe.adapters.native_errors import native_call
from bmoe.adapters.router_gates import RouterGates
from bmoe.adapters.streaming_capture import StreamingUnavailable, locate_experts
from bmoe.adapters.streaming_repack import repack_weights
from bmoe.adapters.streaming_store import StoreUse, find_store, use_store
from bmoe.cext import expert_stream
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.moe_arch import expert_projections, expert_tensor_name, serves_expert_rows
from bmoe.domain.streaming import (
    Budget,
    ReadFault,
    RunMemory,
    StreamConfig,
    StreamCounters,
    StreamFault,
    resolve_budget,
)
from bmoe.domain.streaming.engine_options import EngineOptions
from bmoe.domain.streaming.headroom import run_margin_bytes
from bmoe.domain.streaming.page_recycling import recycling_fits, worst_case_mappings
from bmoe.domain.streaming.rank_worker import rank_on_worker
from bmoe.domain.weight_layout import WeightLayout

# StreamingUnavailable lives with the capture, which raises it too; its importers find it here
__all__ = [
    "ExpertStreaming",
    "StreamingInfo",
    "StreamingUnavailable",
    "has_streamable_experts",
    "plan_projections",
]


def has_streamable_experts(path: Path) -> bool:
    """Whether the GGUF at ``path`` is a MoE model of the expert registry (read from its
    header, before loading: a model that will run resident is loaded as one)."""
    arch = str(read_header_values(path, ["general.architecture"]).get("general.architecture", ""))
    if expert_projections(arch) is None:
        return False
    key = f"{arch}.expert_count"
    return int(read_header_values(path, [key]).get(key, 0)) > 1


def plan_projections(
    model: LlamaModel, layout: ModelLayout
) -> tuple[tuple[str, ...], list[tuple[int, int, TensorLocation]]]:
    """The projection names and every routed-expert tensor as ``(layer, proj, location)``.

    Raises ``StreamingUnavailable`` for a model bmoe cannot stream.
    """
    arch = model.arch
    names = expert_projections(arch)
    if names is None:
        raise StreamingUnavailable(f"architecture {arch!r} is not in bmoe's expert registry")
    n_expert = model.n_expert
    if n_expert <= 1:
        raise StreamingUnavailable(f"{arch} model has no routed experts")
    found = []
    for layer in range(model.n_layer):
        for p, name in enumerate(names):
            loc = layout.tensors.get(expert_tensor_name(layer, name))
            if loc is None:
                continue
            if len(loc.shape) != 3 or loc.shape[2] != n_expert or loc.n_bytes % n_expert:
                raise StreamingUnavailable(f"{loc.name} is not a [*, *, {n_expert}] expert tensor")
            found.append((layer, p, loc))
    if not found:
        raise StreamingUnavailable(f"no routed-expert tensors found in this {arch} model")
    return names, found


def _recycling_off(n_slices: int) -> str:
    """Why page recycling must stay off for a model of ``n_slices`` expert slices ("" when it
    may be used): the process's memory mappings it could take, against ``vm.max_map_count``."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as maps:
            in_use = sum(1 for _ in maps)
    except (OSError, ValueError):
        return "the process's memory mapping limit is unknown"
    if recycling_fits(n_slices, limit, in_use):
        return ""
    return (
        f"it could take {worst_case_mappings(n_slices):,} memory mappings, next to {in_use:,} in use, "
        f"of the {limit:,} a process may have (vm.max_map_count)"
    )


def _read_files(model_paths: Sequence[Path], store: Path | None) -> list[str]:
    """The files the lanes read, by the streamer's file index: the model's, then the expert
    store where one serves."""
    return [str(p) for p in model_paths] + ([str(store)] if store is not None else [])


@attrs.frozen
class StreamingInfo:
    """What ``attach`` set up, for the ``mode:`` line and ``BMOE_READY``."""

    budget: Budget
    odirect: bool
    lanes: int
    token_cycle_bytes: int
    expert_bytes: int  # all routed experts, all layers
    dense_copied_bytes: int
    entry_bytes: int  # one (layer, expert) cache entry: all its projections (the largest layer's)
    recycling: bool = True  # evicted pages move under the next read's slices
    recycling_off: str = ""  # why not, when it is off
    repack: WeightLayout = attrs.field(factory=lambda: WeightLayout(asked=False))
    store: StoreUse = attrs.field(factory=StoreUse)  # the expert store read from, if any
    # experts may live in other rows than their own, the ids rewritten (``MoeArch.gathers_by_id``
    # unset, and every layer routed on the host): what ``--cache-victims layer`` needs to read
    # a miss into its victim's row
    rows: bool = True


class ExpertStreaming:
    """The streaming state of one session: the C streamer plus what Python needs to know."""

    def __init__(
        self,
        streamer: expert_stream.ExpertStreamer,
        layout: ModelLayout,
        info: StreamingInfo,
        engine: EngineOptions,
        gates: RouterGates | None = None,
    ) -> None:
        self.streamer = streamer
        self.layout = layout
        self.info = info
        self.engine = engine  # resolved for this machine; the streamer takes it with StreamerSettings
        self._gates = gates  # owns the routers' F32 copies the streamer reads
        self._files = MappedFiles.snapshot(layout.paths[0])

    @property
    def read_paths(self) -> list[str]:
        """The files the lanes read, by the streamer's file index: the model's, then the
        expert store where one serves."""
        return _read_files(self.layout.paths, self.info.store.path)

    def tensor_at(self, index: int, offset: int) -> str:
        """The tensor holding byte ``offset`` of read file ``index`` ("" for none)."""
        manifest = self.info.store.manifest
        if index < len(self.layout.paths) or manifest is None:
            return self.layout.tensor_at(index, offset)
        return manifest.tensor_at(offset)

    @staticmethod
    def new_streamer(
        model: LlamaModel, fault_flag_address: int
    ) -> tuple[expert_stream.ExpertStreamer, ModelLayout, list[tuple[int, int, TensorLocation]]]:
        """The C streamer to pass as the context's eval callback (before the context exists).

        The registry and the expert count are checked before the file's layout is read: a
        model bmoe cannot stream costs no layout work."""
        if expert_projections(model.arch) is None:
            raise StreamingUnavailable(f"architecture {model.arch!r} is not in bmoe's expert registry")
        if model.n_expert <= 1:
            raise StreamingUnavailable(f"{model.arch} model has no routed experts")
        layout = read_layout(model.path)
        names, found = plan_projections(model, layout)
        with native_call("expert streaming: allocating the streamer"):
            streamer = expert_stream.ExpertStreamer(
                n_layer=model.n_layer,
                n_expert=model.n_expert,
                n_proj=len(names),
                fault_flag_address=fault_flag_address,
            )
            api = backend_api()  # layers on a device: ids read back, device weights not captured
            streamer.set_backend_api(api["tensor_get"], api["buffer_is_host"], api["nbytes"])
        return streamer, layout, found

    @classmethod
    def attach(
        cls,
        model: LlamaModel,
        ctx: LlamaContext,
        streamer: expert_stream.ExpertStreamer,
        layout: ModelLayout,
        found: list[tuple[int, int, TensorLocation]],
        config: StreamConfig,
        *,
        memory_room: Callable[[], MemoryRoom],
        repack: bool = True,
        refuse: tuple[str, ...] = (),
        kept_compute_bytes: int | None = None,
        prompt_states_bytes: int = 0,
    ) -> ExpertStreaming:
        """The streamer set up on ``ctx``'s graph. ``kept_compute_bytes``: what llama.cpp's
        compute buffer keeps beside the cache (``--cache-mb auto`` subtracts it); None, all
        it reserved; less where the cache lends a prompt-sized buffer its room
        (``bmoe.domain.streaming.prefill_memory``). ``prompt_states_bytes``: what the prompt
        cache's memory tier may come to hold (``--cache-mb auto`` sets it aside too)."""
        # 1. capture: where did llama.cpp put each file? (the streamed experts: those on the host)
        every_expert_tensor = list(found)  # an expert store holds them all, offloaded ones too
        found, bases = locate_experts(model, ctx, streamer, layout, found)
        # 2. overlay every mapped file's data region; copy the dense bytes in
        dense = overlay_dense(streamer, layout, found, bases)
        # 3. reads and budget (an expert store, where one serves this model, is the last file)
        store = find_store(config.expert_store if repack else "off", layout.paths, every_expert_tensor)
        with native_call("expert streaming: opening the model files for the read lanes"):
            odirect = streamer.open_files(
                _read_files(layout.paths, store.path), odirect=config.odirect, n_lanes=config.io_threads
            )
        # the engine's A/B switches, in one place (EngineOptions: the output never changes),
        # resolved for this machine; the caller hands them to the streamer with its other
        # setup knobs (StreamerSettings, ExpertStreamer.configure)
        options = config.engine or EngineOptions.from_environ(os.environ)
        recycling_off = _recycling_off(len(found) * model.n_expert)
        engine = attrs.evolve(
            options,
            rank_worker=rank_on_worker(
                options.rank_worker, len(os.sched_getaffinity(0)), ctx.params.n_threads
            ),
            page_recycle=options.page_recycle and not recycling_off,
        )
        n_used = max(1, model.n_expert_used)
        per_expert: dict[int, int] = {}
        for layer, _, loc in found:
            per_expert[layer] = per_expert.get(layer, 0) + loc.n_bytes // model.n_expert
        cycle = sum(v * n_used for v in per_expert.values())
        # read now, with the dense part copied in and the KV cache cleared (both in the
        # room's reading), the compute buffer still untouched (subtracted): domain.streaming.budget.
        # Before the repack (step 5), which moves dense weights into buffers of its own and gives
        # their overlay pages back: only until then is ``dense`` what the room's reading holds
        memory = RunMemory(
            memory_room(),
            dense_bytes=dense,
            kv_bytes=ctx.kv_bytes,
            compute_buffer_bytes=(
                ctx.compute_buffer_bytes if kept_compute_bytes is None else kept_compute_bytes
            ),
            prompt_states_bytes=prompt_states_bytes,
            run_margin_bytes=run_margin_bytes(config.io_threads, max(per_expert.values())),
        )
        two_layers = 2 * max(per_expert.values()) * n_used  # the least auto takes
        budget = resolve_budget(config, memory=memory, token_cycle_bytes=cycle, least_bytes=two_layers)
        streamer.set_budget(budget.bytes)
        # 4. the routers, for the decode routing policies that evaluate them
        gates = None
        if config.needs_routers:
            gates = RouterGates()
            if not gates.attach(
                streamer,
                layout,
                bases,
                sorted(per_expert),
                arch=model.arch,
                n_expert=model.n_expert,
                n_expert_used=n_used,
            ):
                raise StreamingUnavailable(
                    "the routers (ffn_gate_inp) are not where the routing policies need them"
                )
        # 5. repacked weights, as llama.cpp would have them
        repacked = (
            repack_weights(model, streamer, found, options.repack_parts, refuse)
            if repack
            else WeightLayout(asked=False)
        )
        stored = use_store(streamer, store, len(layout.paths), layout.paths, found, model.n_expert)
        info = StreamingInfo(
            budget=budget,
            odirect=odirect,
            lanes=config.io_threads,
            token_cycle_bytes=cycle,
            expert_bytes=sum(loc.n_bytes for _, _, loc in found),
            dense_copied_bytes=dense,
            entry_bytes=max(per_expert.values()),
            recycling=engine.page_recycle,
            recycling_off=recycling_off,
            repack=repacked,
            store=stored,
            # the ids of a layer routed on a device are copied to the host: rows need them here
            rows=serves_expert_rows(model.arch) and not streamer.captured_on_devices(),
        )
        return cls(streamer, layout, info, engine, gates)

    # -- between requests ------------------------------------------------------------------

    def counters(self) -> StreamCounters:
        """The fast path's counters (the C cache core, its timers and the routing policies'):
        the streamer reports them under ``StreamCounters``' field names."""
        return StreamCounters.of({**self.streamer.stats(), **self.streamer.routing_stats()})

    def fault(self) -> StreamFault | None:
        """The streamer's sticky fault, else a model file replaced or truncated under us."""
        fault = streamer_fault(self.streamer, self.read_paths, self.tensor_at)
        if fault is not None:
            return fault
        changes = self._files.changes()
        if not changes:
            return None
        change = changes[0]
        if change.kind == "gone":
            return ReadFault(str(change.path), 0, change.errno, "the model file is gone")
        return ReadFault(
            str(change.path),
            change.size,
            errno.ESTALE,
            "the model file was replaced or truncated under the session",
        )
