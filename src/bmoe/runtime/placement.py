"""A session's placement (``SessionConfig.placement``) as llama.cpp's load takes it: RPC servers
added as devices, the devices picked by name, the expert tensors kept in host memory, and
where every weight landed once loaded (llama.cpp's own buffer figures)."""

from __future__ import annotations

from pathlib import Path

import attrs

from bmoe.adapters.gguf_layout import read_header_values
from bmoe.adapters.llama import devices as ggml_devices
from bmoe.domain.moe_arch import expert_projections
from bmoe.domain.placement import Placement

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
