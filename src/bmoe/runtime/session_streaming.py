"""A session's expert streaming, wired: the context opened with the streamer attached (or
resident, with the line saying why), the memory-pressure governor, the usage profile, and
``generate`` with its stream report (``StreamReport``: the prefill's reads, the decode's).

``Session`` calls these while it opens and after each request; what they have to say goes
to the ``notes`` list they are handed (the session's lines for the user).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs

from bmoe.adapters.expert_streaming import ExpertStreaming, StreamingUnavailable
from bmoe.adapters.llama import LlamaContext, LlamaModel
from bmoe.adapters.llama.context import CCallback
from bmoe.adapters.memory_room import ProcessMemoryRoom
from bmoe.adapters.streaming_store import store_size_text
from bmoe.adapters.usage_profile_file import model_key, profile_path
from bmoe.cext.abort_flag import AbortFlag
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, Progress, RunResult
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.prompt_cache import PromptCache, cache_ram_bytes, follow_budget, memory_tier_bytes
from bmoe.domain.streaming import MIB, StreamConfig, StreamReport
from bmoe.domain.streaming.governor import BudgetChange, GovernorConfig
from bmoe.domain.streaming.prefill_memory import (
    PrefillLending,
    PromptBatch,
    budget_held_to_room,
    decode_compute_bytes,
    lending_floor,
    spare_bytes,
)
from bmoe.domain.weight_layout import WeightLayout
from bmoe.errors import ConfigError
from bmoe.runtime.governor import CacheGovernor
from bmoe.runtime.placement import LoadChoice
from bmoe.runtime.prompt_sizing import given_prompt_batch, lends_given_batch, size_prompt_batch
from bmoe.runtime.session_config import OnLoad, SessionConfig
from bmoe.runtime.streaming import StreamingControl
from bmoe.runtime.usage_profile import ProfileKeeper
from bmoe.runtime.vision import image_cache_bytes
from bmoe.service.session_engine import OnBegin, OnProgress, SessionEngine

Hook = Callable[[CCallback | None, int], CCallback | None]
"""The context's eval callback made of the streamer's (or none) for a context of that
``n_ubatch``: the decide probe's wrapping."""


def open_context(
    model: LlamaModel,
    config: SessionConfig,
    flag: AbortFlag,
    hook: Hook,
    load: LoadChoice,
    notes: list[str],
    on_load: OnLoad | None,
) -> tuple[LlamaContext, StreamingControl | None, WeightLayout | None]:
    """The session's context; with ``config.stream`` on, the streamer attached to it and its
    control (None, and a note, where streaming is unavailable: the model runs resident, its
    weights placed as a plain resident run's); third, what bmoe placed itself, if anything
    (resident with AMX refused, or that fallback). ``model`` is closed if placing fails."""
    n_ubatch = config.context.n_ubatch
    placed = load.place(model)

    def resident(why: StreamingUnavailable | None) -> tuple[LlamaContext, None, WeightLayout | None]:
        done = placed
        if why is not None:  # loaded to stream, so ``place`` placed nothing: placed now
            notes.append(f"moe-stream: {why}; running resident")
            done = load.place_fallback(model)
        ctx = LlamaContext(model, config.context, abort=flag, eval_callback=hook(None, n_ubatch))
        return ctx, None, done

    if not config.stream.enabled:
        return resident(None)
    try:
        streamer, layout, found = ExpertStreaming.new_streamer(model, flag.fault_address)
    except StreamingUnavailable as why:
        return resident(why)
    context = config.context
    if config.placement.offloaded:  # streamed experts are computed where they are read
        context = attrs.evolve(context, op_offload=False)
    memory_room = ProcessMemoryRoom().read  # the governor's reading too (MemoryProbe)
    batch: PromptBatch | None = None
    if config.stream.size_prompt_batch:
        try:
            context, batch = size_prompt_batch(model, context, layout, found, memory_room)
        except BaseException:
            streamer.close()
            raise
    given_room = memory_room().room_bytes if lends_given_batch(config.stream, context.n_ubatch) else None
    ctx = LlamaContext(model, context, abort=flag, eval_callback=hook(streamer, context.n_ubatch))
    per_token = ctx.compute_buffer_bytes / context.n_ubatch
    if given_room is not None:  # -b given beside an auto budget: lent the cache's room too
        batch = given_prompt_batch(context.n_ubatch, given_room, found, layout, per_token, ctx.kv_bytes)
    try:
        if on_load is not None:
            on_load("setting up expert streaming", 0.0)
        streaming = ExpertStreaming.attach(
            model,
            ctx,
            streamer,
            layout,
            found,
            config.stream,
            memory_room=memory_room,
            repack=config.repack,
            refuse=load.amx.refused,
            kept_compute_bytes=None if batch is None else decode_compute_bytes(per_token, context.n_ubatch),
            # set aside: the prompt cache's memory tier and the vision encoder's keep
            prompt_states_bytes=(
                memory_tier_bytes(config.cache_ram_mb, ctx.kv_bytes) + image_cache_bytes(config)
            ),
        )
        if on_load is not None:
            on_load("setting up expert streaming", 1.0)
    except StreamingUnavailable as why:  # nothing was changed yet: a resident context instead
        ctx.close()
        streamer.close()
        return resident(why)
    except BaseException:
        ctx.close()
        raise
    control = StreamingControl(streaming, config.stream)
    ctx.decode_lock = control  # lock held around each decode; a pending budget applied first
    if batch is not None:  # a prompt-sized ubatch borrows the cache's room; its pages go back after
        control.prompt_batch = batch
        info = streaming.info
        floor = lending_floor(info.token_cycle_bytes, batch.room.layer_bytes, info.budget.bytes)
        control.lend_to_prompts(PrefillLending(per_token, floor, spare_bytes(info.budget)))
    ctx.before_decode = control.before_decode  # lending (if any) and --cache-victims auto's windows
    hold_auto_to_room(control, memory_room, notes)
    ctx.explain_abort = control.check
    if config.stream.policy == "reference":
        notes.append("moe-stream: reference policy (Python, slow): for checking the fast path")
    if streaming.info.budget.warning:
        notes.append(f"moe-cache: warning: {streaming.info.budget.warning}")
    if not streaming.info.odirect and config.stream.odirect:
        notes.append("moe-stream: the filesystem refused O_DIRECT: buffered reads")
    if streaming.info.recycling_off:
        off = streaming.info.recycling_off
        notes.append(f"moe-cache: evicted pages are given back, not recycled: {off}")
    if streaming.info.store.path is not None or streaming.info.store.note:
        notes.append(f"moe-stream: {store_size_text(streaming.info.store) or streaming.info.store.note}")
    return ctx, control, None


def hold_auto_to_room(
    control: StreamingControl, memory_room: Callable[[], MemoryRoom], notes: list[str]
) -> None:
    """An ``auto`` budget held to the room read again (``prefill_memory.budget_held_to_room``):
    now, once the setup took what it takes after the budget was set (the repack, the
    routers' copies: measured, the 48-layer bench model's run in 4 GiB met its group's limit
    while its cache filled), and after each prompt that borrowed the cache's room."""
    info = control.info
    memory = info.budget.memory
    if not info.budget.auto or memory is None:
        return

    def held(back: int, resident: int) -> int:
        now = attrs.evolve(memory, room=memory_room())
        return budget_held_to_room(back, resident, now, info.budget.floor_bytes)

    settled = held(info.budget.bytes, control.counters().resident_bytes)
    if settled < info.budget.bytes:
        control.set_budget(settled)
        notes.append(
            f"moe-cache: auto budget {info.budget.bytes / MIB:,.0f} -> {settled / MIB:,.0f} MiB: the room "
            "read again once set up left less"
        )
    if control.lending is not None:
        control.after_prompt = held


def start_governor(
    control: StreamingControl, stream: StreamConfig, cache: PromptCache | None, cache_ram_mb: int
) -> CacheGovernor:
    """The memory-pressure governor (``--cache-governor``), between the token cycle and
    ``--cache-ceil-mb`` (else the budget at start, as held to the room once set up:
    ``hold_auto_to_room``; growing back past it put the 48-layer bench model's run in 4 GiB
    at its group's limit again); under pressure the prompt ``cache`` gives its room back too.
    Its changes are kept in ``governor.changes``; a front end sets ``governor.on_change`` to
    show them."""
    info = control.streaming.info
    start = control.target_budget()
    ceil = stream.cache_ceil_mb * MIB if stream.cache_ceil_mb is not None else start
    floor = min(info.budget.floor_bytes, ceil)
    memory = info.budget.memory
    watermarks = (
        GovernorConfig(floor_bytes=floor, ceil_bytes=ceil)
        if memory is None
        else GovernorConfig.around(memory.headroom.reserve_bytes, floor_bytes=floor, ceil_bytes=ceil)
    )
    governor = CacheGovernor(control, watermarks)
    configured = cache_ram_bytes(cache_ram_mb)
    if cache is not None:  # under pressure, the kept conversations give their room back too

        def follow(change: BudgetChange) -> None:
            follow_budget(cache, configured, change.before, change.after)

        governor.followers.append(follow)
    governor.start()
    return governor


def set_cache_budget(
    control: StreamingControl | None, governor: CacheGovernor | None, budget_mb: int
) -> None:
    """``Session.set_cache_budget``: the expert cache's budget set (``ConfigError`` for a
    negative one or a session that does not stream), the governor's ceiling with it."""
    if budget_mb < 0:
        raise ConfigError(f"cache budget must be >= 0 MiB, not {budget_mb}")
    if control is None:
        raise ConfigError("this session does not stream experts")
    if governor is not None:
        governor.set_ceiling(budget_mb * MIB)
    control.set_budget(budget_mb * MIB)


def open_profile(
    control: StreamingControl, stream: StreamConfig, n_expert_used: int, notes: list[str]
) -> ProfileKeeper | None:
    """The usage profile (``--profile``): warm the cache from it now (in the background)
    and learn into it from now on. Its lines go to ``notes``."""
    paths = control.streaming.layout.paths
    try:
        key = model_key(paths)
    except OSError as exc:
        notes.append(f"moe-profile: cannot read the model to key its profile: {exc}")
        return None
    path = profile_path(stream.profile, key)
    if path is None:
        return None
    keeper = ProfileKeeper(control, path, key, n_expert_used)
    if control.counters().budget_bytes > 0:
        keeper.warm(stream.profile_share)
    take_notes(keeper, notes)
    return keeper


def learn(profile: ProfileKeeper | None, notes: list[str]) -> None:
    """After a request: the profile counts it (and merges every few requests)."""
    if profile is not None:
        profile.after_request()
        take_notes(profile, notes)


def take_notes(keeper: ProfileKeeper, notes: list[str]) -> None:
    """The profile's lines, moved to ``notes``."""
    notes.extend(keeper.notes)
    keeper.notes.clear()


def generate_streamed(
    streaming: StreamingControl,
    engine: SessionEngine,
    request: GenerateRequest,
    on_progress: OnProgress | None,
    on_begin: OnBegin | None,
    history: Sequence[ChatMessage] | None,
    chat: bool | None,
) -> RunResult:
    """``engine.generate`` plus the streaming figures: each token's ``Progress`` carries its
    reads, and the result the run's ``StreamReport`` (the prefill ends at the first token)."""
    marks = [streaming.counters()]  # before, after the prefill
    last = [marks[0]]
    times = [0.0]

    def progress(p: Progress) -> None:
        now = streaming.counters()
        if p.step == 1:  # sampled from the prefill's logits: the prefill's reads are not its own
            marks.append(now)
            times.append(time.perf_counter())
            last[0] = now
        if on_progress is not None:
            on_progress(attrs.evolve(p, stream=now - last[0]))
        last[0] = now

    result = engine.generate(request, progress, on_begin, history=history, chat=chat)
    end = streaming.counters()
    streaming.end_turn()
    after_prefill = marks[1] if len(marks) > 1 else end
    decode_wall = time.perf_counter() - times[1] if len(times) > 1 else 0.0
    report = StreamReport(
        prefill=after_prefill - marks[0],
        decode=end - after_prefill,
        decode_steps=max(0, len(result.tokens) - 1),
        decode_wall_s=decode_wall,
        expert_bytes=streaming.info.expert_bytes,
    )
    return attrs.evolve(result, stream=report)
