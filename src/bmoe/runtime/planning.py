"""``python -m bmoe.plan`` wired: a model's figures from its GGUF header (a local file, or a
Hub model's headers fetched by range requests), this machine's figures (the memory room, the
disk's ``O_DIRECT`` speed at the expert-read size, a short matmul), the model's usage
profile where one exists, and ``bmoe.domain.plan.predict.make_plan`` over them. The bench
(``--plan``), the server (``/props``) and ``bmoe.launch`` use it too."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
from pathlib import Path

import attrs

from bmoe.adapters.cache_dirs import cache_root
from bmoe.adapters.cpu_topology import physical_cores
from bmoe.adapters.disk_reads import measure_random_reads, measure_scratch
from bmoe.adapters.gguf_layout import ModelLayout, read_header_values, read_layout
from bmoe.adapters.gguf_remote import remote_headers
from bmoe.adapters.memory_room import ProcessMemoryRoom
from bmoe.adapters.usage_profile_file import model_key, profile_path, read_profile
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.moe_arch import expert_projections, expert_tensor_name
from bmoe.domain.plan.figures import MIB, MachineFigures, ModelFigures
from bmoe.domain.plan.predict import Plan, PlanSettings, make_plan
from bmoe.domain.streaming.usage_profile import ProfileRejected, UsageProfile
from bmoe.errors import ConfigError
from bmoe.runtime.compute_calibration import measure_llama

PAGE = 4096
DISK_SAMPLE_BYTES = 64 * MIB  # read to measure the disk
_KEYS = (
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.kv_lora_rank",
    "rope.dimension_count",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "context_length",
)


@attrs.frozen
class MachineOptions:
    """``--mem-limit-mb`` (None: the room as ``--cache-mb auto`` reads it), ``--disk-mib-s``
    (None: measured)."""

    mem_limit_mb: int | None = None
    disk_mib_s: float | None = None


@attrs.frozen
class PlannedModel:
    """A plan and how its model was read (``source``: one line for the user)."""

    plan: Plan
    source: str


def _attention_layers(layout: ModelLayout, n_layer: int) -> int:
    """Layers with a KV cache: those with attention's K (or fused QKV, or MLA's) weights."""
    marks = ("attn_k.", "attn_qkv.", "attn_kv_a_mqa.", "attn_k_b.")
    layers = {
        int(name.split(".")[1])
        for name in layout.tensors
        if name.startswith("blk.") and any(m in name for m in marks)
    }
    return len(layers) or n_layer


def model_figures(layout: ModelLayout, first: Path, name: str) -> ModelFigures:
    """The figures of the model whose header files ``layout`` was read from (``first``:
    the first file, for its metadata). Raises ``ConfigError`` for a model bmoe cannot stream."""
    arch = str(read_header_values(first, ["general.architecture"]).get("general.architecture", ""))
    raw = read_header_values(first, [f"{arch}.{k}" for k in _KEYS])
    v = {k: int(raw[f"{arch}.{k}"]) for k in _KEYS if isinstance(raw.get(f"{arch}.{k}"), int)}
    projections = expert_projections(arch)
    n_layer, n_expert = v.get("block_count", 0), v.get("expert_count", 0)
    if projections is None or n_expert <= 1:
        why = "not in bmoe's expert registry" if projections is None else "a model without routed experts"
        raise ConfigError(f"{name}: architecture {arch!r} is {why}: there is nothing to stream or plan")
    per_layer: dict[int, int] = {}
    slices: list[int] = []
    weights = 0
    down = None
    for layer in range(n_layer):
        for projection in projections:
            loc = layout.tensors.get(expert_tensor_name(layer, projection))
            if loc is None or len(loc.shape) != 3 or loc.shape[2] != n_expert:
                continue
            per_layer[layer] = per_layer.get(layer, 0) + loc.n_bytes
            slices.append(loc.n_bytes // n_expert)
            weights += math.prod(loc.shape)
            if projection == "ffn_down_exps":
                down = loc
    if not per_layer:
        raise ConfigError(f"{name}: no routed-expert tensors found in this {arch} model")
    expert_bytes = sum(per_layer.values())
    k = max(1, v.get("expert_used_count", 1))
    n_embd = v.get("embedding_length", 0)
    n_head = v.get("attention.head_count", 1)
    n_head_kv = v.get("attention.head_count_kv", n_head)
    key = v.get("attention.key_length", n_embd // max(1, n_head))
    value = v.get("attention.value_length", key)
    if "attention.kv_lora_rank" in v:  # MLA: the compressed KV and the rope part, one head
        per_layer_kv = v["attention.kv_lora_rank"] + v.get("rope.dimension_count", 0)
    else:
        per_layer_kv = n_head_kv * (key + value)
    embd = layout.tensors.get("token_embd.weight")
    return ModelFigures(
        name=name,
        arch=arch,
        file_bytes=sum(layout.sizes),
        n_layer=n_layer,
        moe_layers=tuple(sorted(per_layer)),
        n_expert=n_expert,
        n_expert_used=k,
        expert_bytes=expert_bytes,
        entry_bytes=max(per_layer.values()) // n_expert,
        layer_bytes=max(per_layer.values()),
        token_cycle_bytes=sum(b // n_expert * k for b in per_layer.values()),
        read_bytes=max(slices),
        kv_bytes_per_token=2 * per_layer_kv * _attention_layers(layout, n_layer),
        n_embd=n_embd,
        n_vocab=embd.shape[1] if embd is not None and len(embd.shape) == 2 else 0,
        n_head=n_head,
        n_ff_exp=v.get("expert_feed_forward_length", down.shape[0] if down is not None else 0),
        n_ctx_train=v.get("context_length", 0),
        bytes_per_weight=expert_bytes / max(1, weights),
    )


def memory_room(mem_limit_mb: int | None) -> tuple[MemoryRoom, str]:
    """The room as ``--cache-mb auto`` reads it, or as a fresh ``--mem-limit-mb`` cgroup would
    leave it (``MemAvailable`` where lower) to a run: the limit less what this process holds
    already (the interpreter and llama.cpp's library, as a run's own process holds them)."""
    room = ProcessMemoryRoom().read()
    if mem_limit_mb is None:
        return room, room.describe()
    limit = mem_limit_mb * MIB
    group_room = max(0, limit - _process_bytes())
    limited = MemoryRoom(
        room.available_bytes, room.total_bytes, limit_bytes=limit, group_room_bytes=group_room
    )
    return limited, f"--mem-limit-mb {mem_limit_mb}"


@functools.cache
def _process_bytes() -> int:
    """This process's resident memory, read once: every plan of the process holds the same
    (its RSS moves by a few MiB as it plans, and two plans of one model must agree)."""
    return ProcessMemoryRoom().own_bytes()


def hf_cache_dir() -> Path:
    """Where ``-hf`` would put the model (huggingface_hub's cache)."""
    if hub := os.environ.get("HF_HUB_CACHE"):
        return Path(hub)
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "hub"


def _existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def read_machine(
    model: ModelFigures, options: MachineOptions, *, local: Path | None, goes_to: Path
) -> MachineFigures:
    """This machine's figures: the disk measured on ``local`` (the model's file) or, for a
    model not here yet, on a scratch file in ``goes_to``."""
    room, room_source = memory_room(options.mem_limit_mb)
    block = max(PAGE, -(-model.read_bytes // PAGE) * PAGE)
    if options.disk_mib_s is not None:
        disk, disk_source = options.disk_mib_s, "--disk-mib-s"
    elif local is not None:
        bw = measure_random_reads(local, DISK_SAMPLE_BYTES, block=block)
        disk, disk_source = bw.mib_s, f"measured on the model file, {block // 1024} KiB reads"
    else:
        folder = _existing(goes_to)
        bw = measure_scratch(folder, block=block)
        disk, disk_source = bw.mib_s, f"measured on a scratch file in {folder}, {block // 1024} KiB reads"
    calibrated = measure_llama(model.bytes_per_weight, physical_cores())
    rate = calibrated.rate
    free = None
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(_existing(goes_to)).free
    return MachineFigures(
        room=room,
        disk_mib_s=disk,
        disk_source=disk_source,
        matvec_bytes_s=rate.matvec_bytes_s,
        matmul_flops=rate.matmul_flops,
        cores=len(os.sched_getaffinity(0)),
        free_disk_bytes=free,
        room_source=room_source,
        compute_source=calibrated.source,
    )


def usage_profile(layout: ModelLayout, model: ModelFigures) -> UsageProfile | None:
    """This model's usage profile (``--profile auto``'s file), where one exists and is sound."""
    try:
        path = profile_path("auto", model_key(layout.paths))
        return (
            None
            if path is None
            else read_profile(path, model_key(layout.paths), model.n_layer, model.n_expert)
        )
    except (OSError, ProfileRejected):
        return None


def cache_disk_dir(model: ModelFigures) -> str:
    """The ``--cache-disk`` folder the plan recommends: one per model under bmoe's cache root."""
    stem = Path(model.name).name.removesuffix(".gguf")
    return str(cache_root() / "prompt-states" / stem)


def plan_local(path: Path, settings: PlanSettings, options: MachineOptions) -> PlannedModel:
    """The plan of a model file here (its header only is read, and a sample of its data to
    measure the disk)."""
    layout = read_layout(path)
    model = model_figures(layout, layout.paths[0], str(path))
    machine = read_machine(model, options, local=path, goes_to=path.parent)
    settings = attrs.evolve(settings, cache_disk=settings.cache_disk or cache_disk_dir(model))
    plan = make_plan(model, machine, settings, usage_profile(layout, model))
    shards = f" ({len(layout.paths)} shards)" if len(layout.paths) > 1 else ""
    return PlannedModel(plan, f"{path}{shards}: header read, {sum(layout.sizes) / (1 << 30):.2f} GiB on disk")


def plan_hf(spec: str, hf_file: str | None, settings: PlanSettings, options: MachineOptions) -> PlannedModel:
    """The plan of a Hub model from its headers alone (``bmoe.adapters.gguf_remote``)."""
    with remote_headers(spec, hf_file) as remote:
        layout = attrs.evolve(read_layout(remote.paths[0]), sizes=remote.sizes)
        model = model_figures(layout, remote.paths[0], f"{remote.repo}/{remote.names[0]}")
    machine = read_machine(model, options, local=None, goes_to=hf_cache_dir())
    settings = attrs.evolve(settings, cache_disk=settings.cache_disk or cache_disk_dir(model))
    return PlannedModel(make_plan(model, machine, settings), remote.describe())
