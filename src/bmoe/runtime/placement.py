"""Where a session's weights sit and in which layout, decided before the model loads.

- ``LoadChoice``: whether the experts stream (a model without routed experts in the registry
  runs resident even when asked to stream), the AMX choice (``bmoe.runtime.cpu_choice``),
  whether llama.cpp repacks at load or bmoe places the weights itself (AMX refused), and the
  placement (``SessionConfig.placement``) as llama.cpp's load takes it: RPC servers added as
  devices, the devices picked by name, the expert tensors kept in host memory;
- what the weights' layout is once loaded (``WeightLayout``, the buffer types) and where
  every weight landed (llama.cpp's own buffer figures, the ``placement:`` line).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from bmoe.adapters.expert_streaming import has_streamable_experts
from bmoe.adapters.gguf_layout import read_header_values
from bmoe.adapters.llama import LlamaModel
from bmoe.adapters.llama import devices as ggml_devices
from bmoe.adapters.llama.model import ModelParams
from bmoe.adapters.llama.repack import offered_buffer_types
from bmoe.adapters.resident_placement import place_resident
from bmoe.domain.cpu_features import AmxChoice
from bmoe.domain.moe_arch import expert_projections
from bmoe.domain.placement import Placement
from bmoe.domain.weight_layout import WeightLayout
from bmoe.runtime.cpu_choice import amx_choice
from bmoe.runtime.session_config import OnLoad, SessionConfig

MIB = 1024 * 1024


@attrs.frozen
class ModelPlacement:
    """What ``ModelParams`` needs: ``n_gpu_layers``, device handles, host patterns."""

    n_gpu_layers: int = 0
    devices: tuple[int, ...] = ()
    host_patterns: tuple[str, ...] = ()


def resolve(placement: Placement, model_path: Path, *, streaming: bool) -> ModelPlacement:
    """Add the RPC servers, pick the devices and the expert tensors to keep on the host
    (ConfigError when a device or server is not there)."""
    if not placement.offloaded:
        return ModelPlacement()
    if placement.rpc:
        ggml_devices.add_rpc_servers(placement.rpc)
    chosen = ggml_devices.offload_devices(placement.devices)
    arch = read_header_values(model_path, ["general.architecture"]).get("general.architecture")
    projections = expert_projections(str(arch)) or ()
    return ModelPlacement(
        n_gpu_layers=placement.n_gpu_layers,
        devices=tuple(d.handle for d in chosen),
        host_patterns=placement.host_expert_patterns(projections, streaming) if projections else (),
    )


def where_line(placement: Placement, weight_buffers: dict[str, int]) -> str:
    """``placement: -ngl 8 --rpc 127.0.0.1:50052 (weights: RPC0 120 MiB, CPU_Mapped 3.1 GiB)``;
    empty when everything is on the CPU."""
    if not placement.offloaded:
        return ""
    parts = ", ".join(f"{name} {_size(n)}" for name, n in weight_buffers.items())
    return f"placement: {placement.summary()} (weights: {parts})"


def _size(n: int) -> str:
    return f"{n / (1024 * MIB):.1f} GiB" if n >= 1024 * MIB else f"{n / MIB:.0f} MiB"


@attrs.frozen
class LoadChoice:
    """How a session's model is loaded: ``streams_experts`` (asked to stream, and a model
    with routed experts), ``repack`` (``SessionConfig.repack``), ``amx`` and ``where``."""

    streams_experts: bool
    repack: bool
    amx: AmxChoice
    where: ModelPlacement

    @classmethod
    def of(cls, config: SessionConfig) -> LoadChoice:
        """The choice for ``config`` (probes AMX where its answer decides; adds the RPC
        servers; ``ConfigError`` when a device or server is not there)."""
        # a model without routed experts in the registry runs resident even if asked to
        # stream: it is loaded as one (llama.cpp repacks it)
        streams_experts = config.stream.enabled and has_streamable_experts(config.model_path)
        # AMX refused (its tiles fault here, or --amx off): bmoe places the weights itself
        amx = amx_choice(config.amx, config.repack, config.context.n_threads)
        where = resolve(config.placement, config.model_path, streaming=config.stream.enabled)
        return cls(streams_experts, config.repack, amx, where)

    @property
    def repack_at_load(self) -> bool:
        """llama.cpp repacks the weights as it loads them (stock llama.cpp's way)."""
        return self.repack and not self.streams_experts and not self.amx.self_placed

    def model_params(self, n_expert_used: int | None, on_load: OnLoad | None) -> ModelParams:
        return ModelParams(
            n_gpu_layers=self.where.n_gpu_layers,
            devices=self.where.devices,
            host_patterns=self.where.host_patterns,
            # resident: llama.cpp repacks at load; streamed: attach repacks (the experts
            # must stay where the streamer reads them)
            use_extra_bufts=self.repack_at_load,
            # streamed: the load need not read the experts (bmoe reads them as routed)
            populate=not self.streams_experts,
            n_expert_used=n_expert_used,
            on_progress=None if on_load is None else (lambda f: on_load("loading the model", f)),
        )

    def place(self, model: LlamaModel) -> WeightLayout | None:
        """Resident with AMX refused: bmoe moves the weights into the buffer types it may use
        (what it placed); otherwise nothing. ``model`` is closed when this fails."""
        if not (self.repack and not self.streams_experts and self.amx.self_placed):
            return None
        try:
            return place_resident(model, self.amx.refused)
        except BaseException:
            model.close()
            raise

    def place_fallback(self, model: LlamaModel) -> WeightLayout | None:
        """Asked to stream and unable to (the model runs resident): the weights placed as a
        plain resident run's, so that the output equals it bit for bit (llama.cpp's own
        placement, made by bmoe: AMX included only where it may be used); None with
        ``--no-repack`` (the file's layout, as a plain resident run's)."""
        if not (self.repack and self.streams_experts):
            return None
        return place_resident(model, self.amx.refused)

    def layout(
        self, model: LlamaModel, streamed: WeightLayout | None, placed: WeightLayout | None
    ) -> WeightLayout:
        """Which weights compute in llama.cpp's repacked layout (and AMX's refusal, if any):
        ``streamed`` the streamer's (None: resident), ``placed`` what ``place`` placed."""
        layout = self._layout(model, streamed, placed)
        return attrs.evolve(layout, note=self.amx.note) if self.amx.note and layout.asked else layout

    def _layout(
        self, model: LlamaModel, streamed: WeightLayout | None, placed: WeightLayout | None
    ) -> WeightLayout:
        if streamed is not None:
            return streamed
        if not self.repack:
            return WeightLayout(asked=False)
        if placed is not None:  # bmoe placed them: AMX refused, or a streamed load run resident
            return placed
        extra = set(offered_buffer_types())
        buffers = tuple((name, n) for name, n in model.weight_buffers.items() if name in extra and n)
        repacked = sum(n for _, n in buffers) if buffers else model.repacked_bytes
        return WeightLayout(asked=True, available=True, by_llama=True, dense_bytes=repacked, buffers=buffers)


def buffer_types(model: LlamaModel, layout: WeightLayout) -> tuple[str, ...]:
    """The buffer types holding the weights (``CPU_Mapped``, ``CPU_REPACK``, ``AMX``...)."""
    names = [name for name, n in model.weight_buffers.items() if n]
    names += [name for name, n in layout.buffers if n]
    if layout.expert_tensors:
        names.append("CPU_REPACK")
    return tuple(dict.fromkeys(names))
