"""The plan: whether a model fits here, resident or streamed, how fast it would decode and
prefill, and the flags to run it with, from ``ModelFigures`` and ``MachineFigures``.

The arithmetic is the run's own: the prompt batch is ``choose_prompt_batch`` on the same
``PrefillRoom`` a streamed session sizes it from, the budget is ``resolve_budget`` on the
``RunMemory`` a session would read once its dense part and KV cache are in. The speeds are
bounds, not measurements:

- decode: a range (``bmoe.domain.plan.decode_range``): a step is the resident step (the
  weight bytes one token computes with, over the rate a matrix-vector product streams them
  here) + the MiB read a token over the disk's speed + the CPU those MiB cost the step
  (measured here by ``bmoe.runtime.stream_calibration``, or by ``--verify``); the MiB read
  come from each guess of the hit rate (``bmoe.domain.plan.hit_guesses``), so the speed is
  a range from the lowest guess to the highest, with the expected one named;
- prefill of P tokens: each prompt batch routes to nearly every expert of every layer, so it
  reads the experts ``ceil(P / batch)`` times over (once, where the cache holds them all),
  while the compute is ``2 x W x P`` FLOPs (W: the weights a prompt token multiplies by,
  ``ModelFigures.prompt_token_weights``) at the matmul rate llama.cpp's
  kernels reached here where each expert computes on as many tokens as the plan's batch
  gives it, plus what a streamed prompt adds a MiB read (the repack, the faults: measured
  here), plus the attention scores (quadratic in the prompt: each batch's queries against
  every KV cell so far) at the rate they ran here; the read-ahead overlaps the reads with the
  compute, so the time is the larger, and at most their sum (none overlapping): a range,
  whose ends take the compute at the calibration's fastest and slowest tries, and at each of
  this machine's recent calibrations' rates (``bmoe.domain.plan.prompt_rates``);
  ``--verify``'s correction multiplies it where one was measured.
"""

from __future__ import annotations

import math

import attrs

from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.plan.decode_range import DecodeCosts, DecodeRange, decode_range
from bmoe.domain.plan.figures import MIB, MachineFigures, ModelFigures
from bmoe.domain.plan.hit_guesses import PROFILE, hit_guesses
from bmoe.domain.plan.hit_rate import CurvePoint, profile_curve
from bmoe.domain.plan.prompt_rates import prompt_compute_s
from bmoe.domain.plan.verified import VerifiedRun, nearest, prefill_run
from bmoe.domain.streaming.budget import (
    Budget,
    RunMemory,
    below_working_set,
    resolve_budget,
)
from bmoe.domain.streaming.config import StreamConfig
from bmoe.domain.streaming.headroom import Headroom, run_margin_bytes
from bmoe.domain.streaming.prefill_memory import (
    PrefillRoom,
    choose_prompt_batch,
    decode_compute_bytes,
)
from bmoe.domain.streaming.usage_profile import UsageProfile

DEFAULT_PROMPT_TOKENS = (2048, 20000)  # a chat's prompt; an agent's first request
WORK_TOKENS = 4096  # room to work past the longest prompt, in the recommended context
CONTEXT_STEP = 1024
RESIDENT_BATCH = 512  # llama.cpp's default prompt batch, a resident run's
CURVE_SHARES = (0.1, 0.25, 0.5, 0.75)  # of every expert: where the profile's curve is shown


@attrs.frozen
class PlanSettings:
    """What the user asked: ``n_ctx`` (None: the longest prompt plus ``WORK_TOKENS``),
    ``cache_mb`` (None: auto), ``prompt_tokens`` (the prefills to time), ``n_parallel``
    (``-np``), ``cache_disk`` (the ``--cache-disk`` folder to recommend; "" none)."""

    n_ctx: int | None = None
    cache_mb: int | None = None
    prompt_tokens: tuple[int, ...] = DEFAULT_PROMPT_TOKENS
    n_parallel: int = 1
    cache_disk: str = ""

    def context(self, model: ModelFigures) -> int:
        if self.n_ctx is not None:
            return self.n_ctx
        longest = max(self.prompt_tokens, default=0) + WORK_TOKENS
        wanted = math.ceil(longest / CONTEXT_STEP) * CONTEXT_STEP
        return min(wanted, model.n_ctx_train) if model.n_ctx_train > 0 else wanted


@attrs.frozen
class Prefill:
    """One prompt: ``seconds`` with the reads overlapping the compute (read ahead), the
    larger of the two; ``fastest_s`` so at the calibration's fastest tries or the fastest of
    this machine's recent calibrations, ``slowest_s`` with none overlapping at the slowest of
    those: the range's ends."""

    tokens: int
    seconds: float
    read_bytes: int
    bound: str  # "disk" or "compute"
    slowest_s: float = 0.0
    fastest_s: float = 0.0


@attrs.frozen
class Plan:
    """The prediction (module docstring). Sizes in bytes, speeds in tokens a second."""

    model: ModelFigures
    machine: MachineFigures
    n_ctx: int
    n_parallel: int
    kv_bytes: int
    compute_per_token: float
    prompt_batch: int
    resident_needs_bytes: int
    resident_fits: bool
    streamed_needs_bytes: int  # dense + KV + compute buffer + two layers' experts + the run's margin
    streamed_fits: bool
    budget: Budget
    hit_rate: float  # uniform-routing floor
    profile_hit_rate: float | None
    profile_curve: tuple[CurvePoint, ...]
    decode: DecodeRange  # every guess of the hit rate, and the decode at each end and expected
    costs: DecodeCosts
    compute_tok_s: float  # the resident step's rate: no streamed decode is faster
    prefills: tuple[Prefill, ...]
    cache_disk: str = ""

    @property
    def read_bytes_per_token(self) -> float:
        """MiB read a token at the expected hit rate (in bytes)."""
        return self.decode.expected.read_bytes

    @property
    def disk_tok_s(self) -> float:
        """The disk's bound alone at the expected hit rate."""
        read = self.read_bytes_per_token
        return self.costs.disk_mib_s * MIB / read if read > 0 else math.inf

    @property
    def cycles(self) -> bool:
        """The budget is below one token's working set: an LRU on routing that repeats hits
        almost never (the adaptive rule's frequency half keeps some)."""
        return self.budget.bytes < self.model.token_cycle_bytes

    def context_holding_cycle(self) -> int:
        """The largest ``-c`` (a multiple of 256) at which the auto budget holds one token's
        working set: the KV cache given up for the cycle's shortfall (0 where none)."""
        m = self.model
        if not m.kv_bytes_per_token or not self.budget.auto:
            return 0
        short = m.token_cycle_bytes - self.budget.bytes
        tokens = (self.kv_bytes - short) // m.kv_bytes_per_token
        return max(0, int(tokens) // 256 * 256)

    @property
    def cache_mb(self) -> int:
        """The budget in MiB, no more than every expert."""
        return min(self.budget.bytes // MIB, -(-self.model.expert_bytes // MIB))

    @property
    def decode_tok_s(self) -> float:
        """The expected decode (module docstring)."""
        return self.decode.expected.tok_s

    @property
    def decode_bound(self) -> str:
        """What takes most of the expected step: the reads (and their CPU) or the compute."""
        streamed = self.decode.expected.step_s - self.costs.resident_step_s
        return "disk" if streamed > self.costs.resident_step_s else "compute"

    def flags(self) -> list[str]:
        """The recommended command-line flags for a streamed run. An auto budget is
        recommended as ``auto``, not as its figure: the run holds an auto budget to the room
        after each long prompt (llama.cpp keeps the prompt's work buffer), which a fixed
        ``--cache-mb`` of the same figure does not (in 2 and 4 GiB groups that figure was
        OOM-killed after a 2,048-token prompt); a budget asked for is capped at every expert.
        No ``-b``: unsaid, the run sizes its prompt batch from the room by the plan's own
        arithmetic (``prompt_batch``) and its cache lends that batch its room while a prompt
        runs; the same figure given as ``-b`` lends nothing (measured: the trained bench model
        at ``-b 1920 --cache-mb auto`` was OOM-killed by a 2,048-token prompt in 2 GiB)."""
        cache = "auto" if self.budget.auto else str(self.cache_mb)
        out = ["--moe-stream", "--cache-mb", cache, "-c", str(self.n_ctx)]
        if self.n_parallel > 1:
            out += ["-np", str(self.n_parallel)]
        if self.cache_disk:
            out += ["--cache-disk", self.cache_disk]
        return out

    def notes(self) -> list[str]:
        """What the user must know, in plain words: a cache that cycles, a model that does not
        fit, and what would."""
        m, out = self.model, []
        room = self.machine.room.room_bytes
        if not self.streamed_fits:
            beside = self.streamed_needs_bytes - self.kv_bytes
            fits_ctx = (room - beside) // m.kv_bytes_per_token if m.kv_bytes_per_token else 0
            what = (
                f"-c {int(fits_ctx) // 256 * 256} would fit"
                if fits_ctx >= 256
                else f"it needs about {(beside + m.kv_bytes(4096)) // MIB} MiB of room at -c 4096"
            )
            out.append(
                f"does not fit even streamed: dense {m.dense_bytes // MIB} + KV {self.kv_bytes // MIB} + "
                f"two layers' experts {least_cache_bytes(m) // MIB} MiB + compute buffer + the run's "
                f"margin, more than the room of {room // MIB} MiB; {what}"
            )
        elif self.budget.bytes == 0:
            out.append("cache off (--cache-mb 0): every token reads its whole working set")
        elif self.cycles:
            out.append(below_working_set(self.budget.bytes // MIB, m.token_cycle_bytes))
            holds = self.context_holding_cycle()
            if holds >= 256:
                out.append(f"-c {holds} leaves the cache one token's working set")
        if self.resident_fits:
            out.append("fits resident: streaming is not needed (it still runs)")
        free = self.machine.free_disk_bytes
        if free is not None and free < m.file_bytes:
            out.append(
                f"the disk has {free // MIB} MiB free where the model goes; it needs {m.file_bytes // MIB}"
            )
        return out


def least_cache_bytes(model: ModelFigures) -> int:
    """The least cache a streamed run holds: two layers' k experts (the one computing and the
    next read), what ``--cache-mb auto`` takes where the room holds less than one token's
    working set (``budget.least_auto_bytes``)."""
    return 2 * model.entry_bytes * model.n_expert_used


def resident_headroom(room: MemoryRoom) -> Headroom:
    """What a resident run keeps free beside the limit that binds it (no read lanes)."""
    return Headroom.of(room, run_margin=run_margin_bytes(0, 0))


def less(room: MemoryRoom, taken: int) -> MemoryRoom:
    """The room once ``taken`` bytes more are in memory."""
    group = None if room.group_room_bytes is None else max(0, room.group_room_bytes - taken)
    return attrs.evolve(room, available_bytes=max(0, room.available_bytes - taken), group_room_bytes=group)


def prefill(
    model: ModelFigures,
    machine: MachineFigures,
    tokens: int,
    batch: int,
    budget: int,
    factor: float | None = None,
) -> Prefill:
    """One prompt of ``tokens`` (module docstring; ``factor``: ``--verify``'s correction)."""
    batch = max(1, min(batch, tokens))
    ubatches = math.ceil(tokens / batch)
    touched = 1.0 - (1.0 - model.n_expert_used / max(1, model.n_expert)) ** batch
    once = model.expert_bytes * touched
    read = once if budget >= model.expert_bytes else once * ubatches
    disk = read / MIB / machine.disk_mib_s if machine.disk_mib_s > 0 else math.inf
    streamed = 0.0
    if machine.stream_costs is not None and budget < model.expert_bytes:
        streamed = read / MIB * machine.stream_costs.prefill_s_per_mib
    compute = prompt_compute_s(model, machine.prompt_rates, tokens, batch, machine.matmul_flops) + streamed
    earlier = [
        prompt_compute_s(model, rates, tokens, batch, machine.matmul_flops) + streamed
        for rates in machine.recent_rates
    ]
    fast, slow = machine.compute_spread
    scale = factor or 1.0
    bound = "disk" if disk > compute else "compute"
    return Prefill(
        tokens,
        max(disk, compute) * scale,
        int(read),
        bound,
        (disk + max([compute * slow, *earlier])) * scale,
        max(disk, min([compute * fast, *earlier])) * scale,
    )


def prefill_scale(
    model: ModelFigures,
    machine: MachineFigures,
    batch: int,
    budget: int,
    tokens: int,
    verified: tuple[VerifiedRun, ...],
) -> float | None:
    """``--verify``'s measured prefill over this plan's own figure for that prompt (module
    ``verified``): the factor that makes a prompt of ``tokens`` what the run measured,
    carried by today's arithmetic; None where no prefill was measured."""
    share = model.cache_share(budget)
    run = prefill_run(verified, share, tokens)
    if run is None:
        return None
    raw = prefill(model, machine, run.prefill_tokens, batch, budget).seconds
    return run.prefill_s / raw if raw > 0 else None


def decode_costs(model: ModelFigures, machine: MachineFigures, run: VerifiedRun | None) -> DecodeCosts:
    """What a step costs beside its hit rate: the CPU a MiB read costs as ``--verify``
    measured it here, else as the streamed calibration did, else nothing counted (said)."""
    if run is not None:
        cpu, source = run.cpu_s_per_mib, "measured here (bmoe.plan --verify)"
    elif machine.stream_costs is not None:
        cpu, source = machine.stream_costs.decode_s_per_mib, machine.stream_costs.source
    else:
        cpu, source = 0.0, "not measured (counted as none)"
    resident = model.active_bytes / machine.matvec_bytes_s if machine.matvec_bytes_s > 0 else 0.0
    return DecodeCosts(model.token_cycle_bytes, machine.disk_mib_s, resident, cpu, source)


def make_plan(
    model: ModelFigures,
    machine: MachineFigures,
    settings: PlanSettings,
    profile: UsageProfile | None = None,
    verified: tuple[VerifiedRun, ...] = (),
) -> Plan:
    """The plan for ``model`` on ``machine`` (``profile``: this model's usage profile, where
    one exists: its hit rate at the budget and at ``CURVE_SHARES`` of the experts;
    ``verified``: what ``bmoe.plan --verify`` measured of it here)."""
    n_ctx = settings.context(model)
    kv = model.kv_bytes(n_ctx)
    per_token = model.compute_per_token(n_ctx)
    room = machine.room.room_bytes
    resident = model.file_bytes + kv + int(per_token * min(n_ctx, RESIDENT_BATCH))
    batch = choose_prompt_batch(
        n_ctx,
        PrefillRoom(
            room_bytes=room,
            dense_bytes=model.dense_bytes,
            kv_bytes=kv,
            layer_bytes=model.layer_bytes,
            compute_per_token=per_token,
        ),
        least=settings.n_parallel,
    )
    kept = decode_compute_bytes(per_token, batch.tokens)
    config = StreamConfig(enabled=True, cache_mb=settings.cache_mb)
    memory = RunMemory(
        less(machine.room, model.dense_bytes + kv),
        model.dense_bytes,
        kv,
        kept,
        run_margin_bytes=run_margin_bytes(config.io_threads, model.entry_bytes),
    )
    budget = resolve_budget(
        config,
        memory=memory,
        token_cycle_bytes=model.token_cycle_bytes,
        least_bytes=least_cache_bytes(model),
    )
    streamed = model.dense_bytes + kv + kept + least_cache_bytes(model) + memory.run_margin_bytes
    prompts = settings.prompt_tokens
    guesses, expected = hit_guesses(model, budget.bytes, profile, verified)
    share = model.cache_share(budget.bytes)
    costs = decode_costs(model, machine, nearest(verified, share))
    profile_hit = next((g.rate for g in guesses if g.name == PROFILE), None)
    curve: tuple[CurvePoint, ...] = ()
    if profile is not None:
        curve = tuple(profile_curve(profile, model.expert_bytes, model.moe_layers, CURVE_SHARES))
    compute_tok_s = 1.0 / costs.resident_step_s if costs.resident_step_s > 0 else math.inf
    return Plan(
        model=model,
        machine=machine,
        n_ctx=n_ctx,
        n_parallel=settings.n_parallel,
        kv_bytes=kv,
        compute_per_token=per_token,
        prompt_batch=batch.tokens,
        resident_needs_bytes=resident,
        resident_fits=resident <= resident_headroom(machine.room).free_bytes,
        streamed_needs_bytes=streamed,
        streamed_fits=streamed <= room,
        budget=budget,
        hit_rate=guesses[0].rate,
        profile_hit_rate=profile_hit,
        profile_curve=curve,
        decode=decode_range(costs, guesses, expected),
        costs=costs,
        compute_tok_s=compute_tok_s,
        prefills=tuple(
            prefill(
                model,
                machine,
                p,
                batch.tokens,
                budget.bytes,
                prefill_scale(model, machine, batch.tokens, budget.bytes, p, verified),
            )
            for p in prompts
        ),
        cache_disk=settings.cache_disk,
    )
