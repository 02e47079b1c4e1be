"""The plan's compute rates, measured with llama.cpp's own kernels: a small generated MoE (the
bench model's layer shape, fewer experts, the plan's quantization) prefilled and decoded
here, and its rates read with the plan's own formulas (``bmoe.domain.plan.predict``):

- ``matmul_flops`` = 2 x the weights a token computes with x the prompt's tokens / the
  prefill's time (a prompt batch of ``PREFILL_TOKENS``);
- ``matvec_bytes_s`` = the weight bytes a token computes with / one decode step's time.

The kernels that will run are the ones to time: on the 5.6 GB bench model, numpy's f32
products (``bmoe.adapters.compute_rate``) predicted a 2,048-token streamed prefill of 19.3 s,
these 24-26 s, against 59-69 s measured: closer, still short (the streamed prefill's repacks,
faults and smaller per-expert batches are not in it: docs/benchmarks.md, "The planner").
The model (a few MiB) is written once into bmoe's fixture folder; the measure takes about a
second. Where it cannot run (llama.cpp
refuses), numpy's rates stand, said in ``source``.
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
from bmoe.adapters.compute_rate import ComputeRate, measure_compute
from bmoe.adapters.file_writes import replacing
from bmoe.adapters.gguf_layout import read_layout
from bmoe.adapters.llama import ContextParams
from bmoe.domain.plan.figures import ModelFigures
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import BmoeError
from bmoe.runtime.model_figures import model_figures
from bmoe.tinymodel.spec import GENERATOR_VERSION
from bmoe.tinymodel.synthetic import QUANTS, SyntheticShape, write_synthetic

if TYPE_CHECKING:
    from bmoe.runtime.session import Session

PREFILL_TOKENS = 512
# prompts timed: 16, 64 and 256 tokens for each of the calibration's experts (its top-8 of 16),
# and one of twice the last in one batch, whose attention scores (quadratic in the prompt) take
# a larger share: the two longest give the attention's rate
ATTENTION_TOKENS = 2 * PREFILL_TOKENS
PROMPT_SIZES = (32, 128, PREFILL_TOKENS, ATTENTION_TOKENS)
DECODE_STEPS = 16
CALIBRATION_SHAPE = SyntheticShape(
    n_layer=2, n_embd=2048, n_ff_exp=768, n_expert=16, n_expert_used=8, head_dim=128, n_ctx_train=1024
)


@attrs.frozen
class Calibrated:
    """The rates, how they were had, and the prefill's FLOP/s by the tokens each expert of a
    prompt batch computes on (ascending; empty where llama.cpp could not be timed)."""

    rate: ComputeRate
    source: str
    matmul_curve: tuple[tuple[float, float], ...] = ()
    attention_flops_s: float = 0.0  # the attention scores' rate (0: not measured)


def calibration_model(quant: str) -> Path:
    """The calibration model of ``quant`` (``q4_0``, ``q8_0``, ``q4_k``), written where missing."""
    folder = fixture_dir() / f"v{GENERATOR_VERSION}" / "plan-calibration"
    path = folder / f"{quant}.gguf"
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
        timed = time_calibration(quant, threads, PROMPT_SIZES)
    except (BmoeError, OSError) as exc:
        return Calibrated(measure_compute(), f"numpy's f32 products (llama.cpp's could not be timed: {exc})")
    seconds = {n: sample.seconds for n, sample in timed.prompts.items()}
    attention = attention_rate(figures, seconds)
    weights = figures.active_bytes / max(figures.bytes_per_weight, 1e-9)
    per_expert = figures.n_expert_used / figures.n_expert  # the share of the tokens an expert gets

    def weights_s(n: int) -> float:  # the prompt's time less its attention scores'
        scores = figures.attention_flops(n, n) / attention if attention > 0 else 0.0
        return max(seconds[n] - scores, 1e-9)

    curve = tuple(
        (n * per_expert, 2.0 * weights * n / weights_s(n)) for n in sorted(seconds) if n <= PREFILL_TOKENS
    )
    rate = ComputeRate(
        matvec_bytes_s=figures.active_bytes / max(timed.step.seconds, 1e-9),
        matmul_flops=curve[-1][1],
    )
    source = f"llama.cpp's {quant.upper()} kernels timed here ({threads} threads)"
    return Calibrated(rate, source, curve, attention)


def attention_rate(figures: ModelFigures, seconds: dict[int, float]) -> float:
    """The attention scores' FLOP/s from the two longest prompts (each in one batch): a
    prompt's time is linear in its tokens for the weights and quadratic for the scores, so
    what the longer took beyond ``ratio`` times the shorter is the scores' difference
    (0 where the difference is lost in the noise)."""
    short, long = PREFILL_TOKENS, ATTENTION_TOKENS
    ratio = long / short
    flops = figures.attention_flops(long, long) - ratio * figures.attention_flops(short, short)
    extra = seconds[long] - ratio * seconds[short]
    return flops / extra if flops > 0 and extra > 0 else 0.0


def time_calibration(
    quant: str, threads: int, sizes: tuple[int, ...], stream: StreamConfig | None = None
) -> Timed:
    """The calibration model of ``quant`` opened (``stream``: streamed so; resident by
    default) with a context for its longest prompt, its prompts of ``sizes`` and its decode
    steps timed (``time_prompts_and_steps``)."""
    from bmoe.runtime.session import Session
    from bmoe.runtime.session_config import SessionConfig

    longest = max(sizes)
    params = ContextParams(
        n_ctx=longest + DECODE_STEPS + 8, n_batch=longest, n_ubatch=longest, n_threads=threads
    )
    tokens = np.random.default_rng(0).integers(16, 200, longest).tolist()
    config = SessionConfig(
        model_path=calibration_model(quant), context=params, stream=stream or StreamConfig()
    )
    with Session.open(config) as session:
        return time_prompts_and_steps(session, tokens, sizes)


@attrs.frozen
class Sample:
    """One timed call: its seconds, and where streamed, its wait for reads and MiB read."""

    seconds: float
    stall_s: float = 0.0
    read_mib: float = 0.0


@attrs.frozen
class Timed:
    """A context's prompts timed (tokens -> the faster of two, each from an empty context)
    and its decode steps (the median step; the steps' mean stall and MiB)."""

    prompts: dict[int, Sample]
    step: Sample


def time_prompts_and_steps(
    session: Session, tokens: list[int], sizes: tuple[int, ...] = PROMPT_SIZES
) -> Timed:
    """Time ``session``'s prompts of ``sizes`` of ``tokens``, then ``DECODE_STEPS`` decode
    steps after the whole prompt; a streamed session's stall and reads with each."""
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
    for n in sizes:
        tries = []
        for _ in range(2):
            ctx.clear()
            tries.append(timed(functools.partial(ctx.decode, tokens[:n], 0)))
        prompts[n] = min(tries, key=lambda t: t.seconds)
    steps = [timed(functools.partial(ctx.decode, [tokens[i]], len(tokens) + i)) for i in range(DECODE_STEPS)]
    step = Sample(
        float(np.median([s.seconds for s in steps])),
        float(np.mean([s.stall_s for s in steps])),
        float(np.mean([s.read_mib for s in steps])),
    )
    return Timed(prompts, step)
