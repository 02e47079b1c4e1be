"""Where a model's weights live: the CPU, a GPU, or llama.cpp RPC servers (as llama.cpp's flags
say it: ``-ngl``, ``--device``, ``--rpc``, ``--cpu-moe``, ``--n-cpu-moe``).

The dense part of the last ``n_gpu_layers`` layers (llama.cpp counts the output layer as one
of them) goes to the devices; the routed experts of a layer go with it unless they are kept on
the host. With expert streaming every expert is kept on the host and streamed (llama.cpp's
``--cpu-moe``), unless ``n_cpu_moe`` says otherwise: then only the experts of the first
``n_cpu_moe`` layers stay on the host (streamed) and the experts of offloaded layers beyond
them are resident on their device, never streamed (a VRAM tier, or RAM pooled over RPC).
Which tensor landed where is llama.cpp's decision; bmoe reads it back from the loaded model
and streams what is on the host.
"""

from __future__ import annotations

import re

import attrs

from bmoe.domain.decide import DecideConfig
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ConfigError

_ENDPOINT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


def parse_rpc_servers(text: str) -> tuple[str, ...]:
    """``--rpc HOST:PORT[,HOST:PORT...]`` as endpoints; ConfigError for a malformed one."""
    servers = tuple(s.strip() for s in text.split(",") if s.strip())
    if not servers:
        raise ConfigError("--rpc needs at least one HOST:PORT")
    for server in servers:
        m = _ENDPOINT.match(server)
        if m is None or not 0 < int(m.group(2)) < 65536:
            raise ConfigError(f"--rpc: {server!r} is not HOST:PORT")
    return servers


def parse_device_names(text: str | None) -> tuple[str, ...]:
    """``--device NAME[,NAME...]`` as names (none when unset)."""
    return tuple(name.strip() for name in (text or "").split(",") if name.strip())


def expert_pattern(projections: tuple[str, ...], layer: int | None = None) -> str:
    """The tensor-name pattern (llama.cpp's ``--override-tensor`` syntax: a regular expression
    searched in the name) of the routed-expert tensors of ``layer``, or of every layer."""
    names = "|".join(re.escape(p) for p in projections)
    prefix = r"^blk\.\d+\." if layer is None else rf"^blk\.{layer}\."
    return rf"{prefix}({names})\.weight$"


@attrs.frozen
class Placement:
    """``n_gpu_layers``: llama.cpp's ``-ngl`` (0: everything on the CPU). ``devices``: the
    ggml devices to use by name (``--device``; empty: every GPU and RPC device). ``rpc``:
    RPC servers that become devices (``--rpc``). ``n_cpu_moe``: keep the experts of the
    first N layers on the host; None: all of them with streaming (``--cpu-moe``), none
    resident (they follow their layer). ``cpu_moe``: all on the host, resident too."""

    n_gpu_layers: int = 0
    devices: tuple[str, ...] = ()
    rpc: tuple[str, ...] = ()
    n_cpu_moe: int | None = None
    cpu_moe: bool = False

    def __attrs_post_init__(self) -> None:
        if self.n_gpu_layers < 0:
            raise ConfigError(f"-ngl must be >= 0, not {self.n_gpu_layers}")
        if self.n_cpu_moe is not None and self.n_cpu_moe < 0:
            raise ConfigError(f"--n-cpu-moe must be >= 0, not {self.n_cpu_moe}")
        if self.cpu_moe and self.n_cpu_moe is not None:
            raise ConfigError("--cpu-moe and --n-cpu-moe exclude each other")
        if (self.devices or self.rpc) and not self.n_gpu_layers:
            raise ConfigError("--device and --rpc place layers only with -ngl N (N > 0)")

    @property
    def offloaded(self) -> bool:
        """Some layer's dense part is on a device."""
        return self.n_gpu_layers > 0

    def host_expert_patterns(self, projections: tuple[str, ...], streaming: bool) -> tuple[str, ...]:
        """The expert tensors to keep in host memory (buffer-type overrides to the CPU)."""
        if not self.offloaded:
            return ()
        if self.n_cpu_moe is not None:
            return tuple(expert_pattern(projections, layer) for layer in range(self.n_cpu_moe))
        if self.cpu_moe or streaming:
            return (expert_pattern(projections),)
        return ()

    def summary(self) -> str:
        """The settings in llama.cpp's flags (empty for the default, all on the CPU)."""
        if not self.offloaded:
            return ""
        parts = [f"-ngl {self.n_gpu_layers}"]
        if self.devices:
            parts.append(f"--device {','.join(self.devices)}")
        if self.rpc:
            parts.append(f"--rpc {','.join(self.rpc)}")
        if self.cpu_moe:
            parts.append("--cpu-moe")
        if self.n_cpu_moe is not None:
            parts.append(f"--n-cpu-moe {self.n_cpu_moe}")
        return " ".join(parts)


def check_placement(placement: Placement, stream: StreamConfig, decide: DecideConfig) -> None:
    """What a placement on devices does not combine with yet (ConfigError): the decide probe
    and the decode routing policies read tensors (hidden states, the router's input) that
    then live on the device."""
    if not placement.offloaded:
        return
    if decide.probe is not None:
        raise ConfigError(
            "--decide-probe with -ngl: the probe reads the hidden states in host memory; "
            "not with layers on a device yet"
        )
    if stream.routing_policies:
        raise ConfigError(
            "the decode routing policies (--predict-*, --route-ahead, --drop-cold-experts, "
            "--expert-substitute) read the router's input in host memory; not with -ngl yet"
        )
