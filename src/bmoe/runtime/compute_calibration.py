"""The plan's compute rates, measured with llama.cpp's own kernels: a small generated MoE (the
bench model's layer shape, fewer experts, the plan's quantization) prefilled and decoded
here, and its rates read with the plan's own formulas (``bmoe.domain.plan.predict``):

- ``matmul_flops`` = 2 x the weights a prompt token multiplies by x the prompt's tokens /
  the prefill's time less its attention scores' (a prompt batch of ``PREFILL_TOKENS``);
- ``attention_flops_s``: the scores' rate, from a long prompt's batches (``attention_rate``);
- ``matvec_bytes_s`` = the weight bytes a token computes with / one decode step's time.

A prompt token does not multiply by every weight: llama.cpp's graphs keep only the tokens
that want logits past the last layer's attention, so the last layer's experts (half of this
two-layer model's) and the output head run for one token a batch
(``ModelFigures.prompt_weights``). Counting them put the rate 1.4x too high, and the
16-layer bench model's 2,048-token resident prefill 25-30% short of the 37-44 s measured.

The kernels that will run are the ones to time: on the 5.6 GB bench model, numpy's f32
products (``bmoe.adapters.compute_rate``) predicted a 2,048-token streamed prefill of 19.3 s,
these 24-26 s, against 59-69 s measured: closer, still short (the streamed prefill's repacks,
faults and smaller per-expert batches are not in it: docs/benchmarks.md, "The planner").
The model (about 110 MiB) is written once into bmoe's fixture folder; the measure takes a
few seconds. Where it cannot run (llama.cpp refuses), numpy's rates stand, said in
``source``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import numpy as np

from bmoe.adapters.cache_dirs import fixture_dir
from bmoe.adapters.calibration_history_file import history_path, read_history, write_history
from bmoe.adapters.compute_rate import ComputeRate, measure_compute
from bmoe.adapters.cpu_features import machine_key
from bmoe.adapters.file_writes import replacing
from bmoe.adapters.gguf_layout import read_layout
from bmoe.adapters.llama import ContextParams
from bmoe.domain.plan.compute_spread import (
    CalibrationRecord,
    recent_rates,
    spread_with_history,
    with_record,
)
from bmoe.domain.plan.figures import ModelFigures
from bmoe.domain.plan.prompt_rates import PromptRates
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import BmoeError
from bmoe.runtime.model_figures import model_figures
from bmoe.tinymodel.spec import GENERATOR_VERSION
from bmoe.tinymodel.synthetic import QUANTS, SyntheticShape, write_synthetic

if TYPE_CHECKING:
    from bmoe.runtime.session import Session

PREFILL_TOKENS = 512
# prompts timed, each in one batch: 32, 128 and 512 tokens (16, 64 and 256 for each of the
# calibration's experts, its top-8 of 16), the last as the first batch of a prompt of
# ``LONG_BATCHES`` batches of 512, each batch timed: each one's queries meet 512 more KV
# cells than the last's, so the batches' growth is the attention scores' rate, measured
# apart from the weights' (a difference of two whole prompts lost it in the noise: 60, 90
# and 536 GFLOP/s in three calibrations a minute apart; 81 measured batch by batch in the
# 16-layer bench model)
PROMPT_SIZES = (32, 128)  # and PREFILL_TOKENS: the long prompt's first batch
LONG_BATCHES = 4
# each prompt (and each batch of the long one) is timed TRIES times, SHORT_TRIES below a
# batch (milliseconds each), and its median kept: a run meets this machine as it usually is,
# not at its fastest (the fastest of two put the 16-layer bench model's prefill 10-20% short)
TRIES = 3
SHORT_TRIES = 7
DECODE_STEPS = 16
CALIBRATION_SHAPE = SyntheticShape(
    n_layer=2, n_embd=2048, n_ff_exp=768, n_expert=16, n_expert_used=8, head_dim=128, n_ctx_train=4096
)


@attrs.frozen
class Calibrated:
    """The rates, how they were had, and the prefill's FLOP/s by the tokens each expert of a
    prompt batch computes on (ascending; empty where llama.cpp could not be timed)."""

    rate: ComputeRate
    source: str
    matmul_curve: tuple[tuple[float, float], ...] = ()
    attention_flops_s: float = 0.0  # the attention scores' rate (0: not measured)
    spread: tuple[float, float] = (1.0, 1.0)  # ``machine_spread``: the tries', widened by the history
    recent_rates: tuple[PromptRates, ...] = ()  # this machine's recent calibrations' (``machine_spread``)


def calibration_model(quant: str) -> Path:
    """The calibration model of ``quant`` (``q4_0``, ``q8_0``, ``q4_k``), written where missing."""
    folder = fixture_dir() / f"v{GENERATOR_VERSION}" / "plan-calibration"
    path = folder / f"{quant}-c{CALIBRATION_SHAPE.n_ctx_train}.gguf"
    if not path.is_file():
        # by the rule: a concurrent writer's identical file may win the rename
        with replacing(path, f"the plan's {quant} calibration model") as tmp:
            write_synthetic(tmp, attrs.evolve(CALIBRATION_SHAPE, quant=quant), seed=3, progress=False)
    return path


def calibration_quant(bytes_per_weight: float) -> str:
    """The calibration's quantization nearest the plan's experts' (bytes a weight)."""
    per_weight = {name: fmt.block_bytes / fmt.block_values for name, fmt in QUANTS.items()}
    return min(per_weight, key=lambda name: abs(per_weight[name] - bytes_per_weight))


def measure_llama(bytes_per_weight: float, threads: int) -> Calibrated:
    """The rates of llama.cpp's kernels here (module docstring), numpy's where it cannot run;
    measured once a process for each quantization and thread count (``bench --plan`` plans
    every configuration it ran, the server its model: one measure serves them all)."""
    return _measured(calibration_quant(bytes_per_weight), threads)


@functools.cache
def _measured(quant: str, threads: int) -> Calibrated:
    try:
        path = calibration_model(quant)
        layout = read_layout(path)
        figures = model_figures(layout, layout.paths[0], str(path))
        timed = time_calibration(quant, threads, PROMPT_SIZES, long_batches=LONG_BATCHES)
    except (BmoeError, OSError) as exc:
        return Calibrated(measure_compute(), f"numpy's f32 products (llama.cpp's could not be timed: {exc})")
    seconds = {n: sample.seconds for n, sample in timed.prompts.items()}
    seconds[PREFILL_TOKENS] = timed.batches[0]  # from an empty context, as the others
    attention = attention_rate(figures, timed.batches, PREFILL_TOKENS)
    weights = figures.prompt_token_weights
    per_expert = figures.n_expert_used / figures.n_expert  # the share of the tokens an expert gets

    def weights_s(n: int) -> float:  # the prompt's time less its attention scores'
        scores = figures.attention_flops(n, n) / attention if attention > 0 else 0.0
        return max(seconds[n] - scores, 1e-9)

    curve = tuple((n * per_expert, 2.0 * weights * n / weights_s(n)) for n in sorted(seconds))
    rate = ComputeRate(
        matvec_bytes_s=figures.active_bytes / max(timed.step.seconds, 1e-9),
        matmul_flops=curve[-1][1],
    )
    source = f"llama.cpp's {quant.upper()} kernels timed here ({threads} threads)"
    spread, recent = machine_spread(quant, threads, timed, PromptRates(curve, attention))
    return Calibrated(rate, source, curve, attention, spread, recent)


def machine_spread(
    quant: str, threads: int, timed: Timed, rates: PromptRates
) -> tuple[tuple[float, float], tuple[PromptRates, ...]]:
    """The calibration's own spread widened by this machine's earlier calibrations, and
    their prompt rates (``bmoe.domain.plan.compute_spread``); this one kept for the next."""
    record = CalibrationRecord(
        at=time.time(),
        key=machine_key(f"plan-calibration:{quant}:{threads}:{CALIBRATION_SHAPE}"),
        seconds=timed.speed_s,
        matmul_curve=rates.matmul_curve,
        attention_flops_s=rates.attention_flops_s,
    )
    path = history_path()
    history = read_history(path)
    write_history(path, with_record(history, record))
    return spread_with_history(timed.spread, record, history), recent_rates(record, history)


def attention_rate(figures: ModelFigures, batch_seconds: tuple[float, ...], batch: int) -> float:
    """The attention scores' FLOP/s from one long prompt's batches of ``batch`` tokens, each
    timed (``batch_seconds``): a batch's time is its weights' (the same in each) and its
    scores', which grow with the KV cells before it; the least-squares slope of the times
    against the scores' FLOPs is the rate's inverse (0 where they do not grow: not measured)."""
    flops = [
        figures.attention_flops((i + 1) * batch, batch) - figures.attention_flops(i * batch, batch)
        for i in range(len(batch_seconds))
    ]
    if len(flops) < 2:
        return 0.0
    mean_f, mean_t = float(np.mean(flops)), float(np.mean(batch_seconds))
    spread = sum((f - mean_f) ** 2 for f in flops)
    slope = sum((f - mean_f) * (t - mean_t) for f, t in zip(flops, batch_seconds, strict=True))
    return spread / slope if spread > 0 and slope > 0 else 0.0


def time_calibration(
    quant: str,
    threads: int,
    sizes: tuple[int, ...],
    stream: StreamConfig | None = None,
    long_batches: int = 0,
) -> Timed:
    """The calibration model of ``quant`` opened (``stream``: streamed so; resident by
    default) with a context for its longest prompt, its prompts of ``sizes``, a prompt of
    ``long_batches`` batches of ``PREFILL_TOKENS`` and its decode steps timed
    (``time_prompts_and_steps``)."""
    from bmoe.runtime.session import Session
    from bmoe.runtime.session_config import SessionConfig

    batch = max((*sizes, PREFILL_TOKENS if long_batches else 0))
    longest = max(batch, long_batches * PREFILL_TOKENS)
    params = ContextParams(n_ctx=longest + DECODE_STEPS + 8, n_batch=batch, n_ubatch=batch, n_threads=threads)
    tokens = np.random.default_rng(0).integers(16, 200, longest).tolist()
    config = SessionConfig(
        model_path=calibration_model(quant), context=params, stream=stream or StreamConfig()
    )
    with Session.open(config) as session:
        return time_prompts_and_steps(session, tokens, sizes, long_batches)


@attrs.frozen
class Sample:
    """One timed call: its seconds, and where streamed, its wait for reads and MiB read."""

    seconds: float
    stall_s: float = 0.0
    read_mib: float = 0.0


@attrs.frozen
class Timed:
    """A context's prompts timed (tokens -> the median of ``TRIES``, or of ``SHORT_TRIES``
    below a batch, each from an empty context), a long prompt's batches (the median of
    ``TRIES`` for each) and its decode steps (the median step; the steps' mean stall and
    MiB); ``spread``: how far the tries moved (``spread``)."""

    prompts: dict[int, Sample]
    step: Sample
    batches: tuple[float, ...] = ()
    spread: tuple[float, float] = (1.0, 1.0)  # the fastest and slowest tries over the medians
    speed_s: float = 0.0  # the measures' medians summed (the calibration's speed: higher, slower)


def time_prompts_and_steps(
    session: Session, tokens: list[int], sizes: tuple[int, ...] = PROMPT_SIZES, long_batches: int = 0
) -> Timed:
    """Time ``session``'s prompts of ``sizes`` of ``tokens``, the batches of a prompt of
    ``long_batches`` batches of ``PREFILL_TOKENS``, then ``DECODE_STEPS`` decode steps after
    the whole prompt; a streamed session's stall and reads with each."""
    ctx, streaming = session.ctx, session.streaming

    def timed(run: Callable[[], object]) -> Sample:
        before = streaming.counters() if streaming is not None else None
        t0 = time.perf_counter()
        run()
        seconds = time.perf_counter() - t0
        if streaming is None or before is None:
            return Sample(seconds)
        used = streaming.counters() - before
        return Sample(seconds, used.stall_s, used.bytes_read / (1 << 20))

    ctx.decode(tokens[:64], 0)  # warm: the weights paged in, the threads started
    prompts: dict[int, Sample] = {}
    every: list[list[float]] = []  # each measure's tries, for the spread
    for n in sizes:
        tries = []
        for _ in range(TRIES if n >= PREFILL_TOKENS else SHORT_TRIES):
            ctx.clear()
            tries.append(timed(functools.partial(ctx.decode, tokens[:n], 0)))
        prompts[n] = sorted(tries, key=lambda t: t.seconds)[len(tries) // 2]
        every.append([t.seconds for t in tries])
    batch = PREFILL_TOKENS
    passes = []
    for _ in range(TRIES if long_batches else 0):
        ctx.clear()
        passes.append(
            [
                timed(functools.partial(ctx.decode, tokens[i * batch : (i + 1) * batch], i * batch)).seconds
                for i in range(long_batches)
            ]
        )
    batches = tuple(float(np.median(times)) for times in zip(*passes, strict=True))
    every.extend(list(times) for times in zip(*passes, strict=True))
    steps = [timed(functools.partial(ctx.decode, [tokens[i]], len(tokens) + i)) for i in range(DECODE_STEPS)]
    step = Sample(
        float(np.median([s.seconds for s in steps])),
        float(np.mean([s.stall_s for s in steps])),
        float(np.mean([s.read_mib for s in steps])),
    )
    return Timed(prompts, step, batches, spread(every), sum(float(np.median(t)) for t in every if t))


def spread(tries: list[list[float]]) -> tuple[float, float]:
    """How far the calibration's measures moved within it: the sum of each one's fastest
    try, and of its slowest, over the sum of its medians ((1, 1) where none was timed)."""
    middle = sum(float(np.median(t)) for t in tries if t)
    if middle <= 0:
        return (1.0, 1.0)
    return (sum(min(t) for t in tries if t) / middle, sum(max(t) for t in tries if t) / middle)
