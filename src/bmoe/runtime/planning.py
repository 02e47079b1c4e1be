"""``python -m bmoe.plan`` wired: a model's figures from its GGUF header (a local file, or a
Hub model's headers fetched by range requests), this machine's figures (the memory room, the
disk's ``O_DIRECT`` speed at the expert-read size, a short matmul), the model's usage
profile where one exists, and ``bmoe.domain.plan.predict.make_plan`` over them. The bench
(``--plan``), the server (``/props``) and ``bmoe.launch`` use it too."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from pathlib import Path

import attrs

from bmoe.adapters.cache_dirs import cache_root
from bmoe.adapters.cpu_topology import physical_cores
from bmoe.adapters.disk_reads import measure_random_reads, measure_scratch
from bmoe.adapters.expert_store_file import written_store
from bmoe.adapters.gguf_layout import ModelLayout, read_layout
from bmoe.adapters.gguf_remote import remote_headers
from bmoe.adapters.memory_room import ProcessMemoryRoom
from bmoe.adapters.plan_runs_file import read_runs, runs_path, write_runs
from bmoe.adapters.usage_profile_file import model_key, profile_path, read_profile
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.plan.figures import MIB, MachineFigures, ModelFigures
from bmoe.domain.plan.predict import Plan, PlanSettings, make_plan
from bmoe.domain.plan.verified import VerifiedRun, kept
from bmoe.domain.streaming.usage_profile import ProfileRejected, UsageProfile
from bmoe.runtime.compute_calibration import measure_llama
from bmoe.runtime.model_figures import model_figures
from bmoe.runtime.stream_calibration import measure_stream_costs

PAGE = 4096
DISK_SAMPLE_BYTES = 64 * MIB  # read to measure the disk


@attrs.frozen
class MachineOptions:
    """``--mem-limit-mb`` (None: the room as ``--cache-mb auto`` reads it), ``--disk-mib-s``
    (None: measured), ``stream_costs`` (False: the CPU a MiB read costs is not measured:
    a plan that needs no speed), ``io_threads`` (``--io-threads``: the lanes' depth)."""

    mem_limit_mb: int | None = None
    disk_mib_s: float | None = None
    stream_costs: bool = True  # measure what streaming costs here beyond its reads
    io_threads: int = 4  # the read lanes: the disk is measured at their depth


@attrs.frozen
class PlannedModel:
    """A plan and how its model was read (``source``: one line for the user); what it was
    made from beside the figures (``settings``, the usage profile, the runs ``--verify``
    kept), so the same model can be planned at another budget (``at_budget``)."""

    plan: Plan
    source: str
    settings: PlanSettings = attrs.field(factory=PlanSettings)
    profile: UsageProfile | None = None
    verified: tuple[VerifiedRun, ...] = ()

    def at_budget(self, cache_mb: int) -> Plan:
        """The same model on the same machine with ``--cache-mb cache_mb``."""
        settings = attrs.evolve(self.settings, cache_mb=cache_mb)
        return make_plan(self.plan.model, self.plan.machine, settings, self.profile, self.verified)


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
        bw = measure_random_reads(local, DISK_SAMPLE_BYTES, block=block, n_lanes=options.io_threads)
        disk, disk_source = (
            bw.mib_s,
            f"measured on the model file, {block // 1024} KiB reads on {bw.lanes} lanes",
        )
    else:
        folder = _existing(goes_to)
        bw = measure_scratch(folder, block=block, n_lanes=options.io_threads)
        disk, disk_source = bw.mib_s, f"measured on a scratch file in {folder}, {block // 1024} KiB reads"
    calibrated = measure_llama(model.bytes_per_weight, physical_cores())
    rate = calibrated.rate
    stream_costs = (
        measure_stream_costs(model.bytes_per_weight, physical_cores()) if options.stream_costs else None
    )
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
        matmul_curve=calibrated.matmul_curve,
        attention_flops_s=calibrated.attention_flops_s,
        compute_spread=calibrated.spread,
        recent_rates=calibrated.recent_rates,
        stream_costs=stream_costs,
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


def verified_runs(layout: ModelLayout) -> tuple[VerifiedRun, ...]:
    """What ``bmoe.plan --verify`` measured of this model here (none where its file is
    missing or unsound: the plan goes on without it)."""
    try:
        return read_runs(runs_path(model_key(layout.paths)))
    except (OSError, ValueError):
        return ()


def keep_verified(path: Path, run: VerifiedRun) -> Path:
    """Keep ``run`` beside this model's earlier runs here (``FileNotKeptError`` where the
    disk refuses); the file it went to."""
    layout = read_layout(path)
    where = runs_path(model_key(layout.paths))
    try:
        earlier = read_runs(where)
    except ValueError:
        earlier = ()  # an unsound file is replaced
    write_runs(where, kept(earlier, run))
    return where


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
    profile, verified = usage_profile(layout, model), verified_runs(layout)
    plan = make_plan(model, machine, settings, profile, verified)
    shards = f" ({len(layout.paths)} shards)" if len(layout.paths) > 1 else ""
    source = (
        f"{path}{shards}: header read, {sum(layout.sizes) / (1 << 30):.2f} GiB on disk; {store_line(layout)}"
    )
    return PlannedModel(plan, source, settings, profile, verified)


def store_line(layout: ModelLayout) -> str:
    """Whether ``python -m bmoe.store`` wrote this model's expert store (where ``--expert-store
    auto`` reads it), or how to write one."""
    store = written_store(model_key(layout.paths))
    if store is not None:
        return f"expert store {store} (its experts read without a repack)"
    return "no expert store (python -m bmoe.store -m MODEL writes one: experts read without a repack)"


def plan_hf(spec: str, hf_file: str | None, settings: PlanSettings, options: MachineOptions) -> PlannedModel:
    """The plan of a Hub model from its headers alone (``bmoe.adapters.gguf_remote``)."""
    with remote_headers(spec, hf_file) as remote:
        layout = attrs.evolve(read_layout(remote.paths[0]), sizes=remote.sizes)
        model = model_figures(layout, remote.paths[0], f"{remote.repo}/{remote.names[0]}")
    machine = read_machine(model, options, local=None, goes_to=hf_cache_dir())
    settings = attrs.evolve(settings, cache_disk=settings.cache_disk or cache_disk_dir(model))
    return PlannedModel(make_plan(model, machine, settings), remote.describe(), settings)
