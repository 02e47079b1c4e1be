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
from pathlib import Path

import attrs
import numpy as np

from bmoe.adapters.cache_dirs import fixture_dir
from bmoe.adapters.compute_rate import ComputeRate, measure_compute
from bmoe.adapters.file_writes import replacing
from bmoe.adapters.gguf_layout import read_layout
from bmoe.adapters.llama import ContextParams
from bmoe.errors import BmoeError
from bmoe.runtime.model_figures import model_figures
from bmoe.tinymodel.spec import GENERATOR_VERSION
from bmoe.tinymodel.synthetic import QUANTS, SyntheticShape, write_synthetic

PREFILL_TOKENS = 512
DECODE_STEPS = 16
CALIBRATION_SHAPE = SyntheticShape(
    n_layer=2, n_embd=2048, n_ff_exp=768, n_expert=16, n_expert_used=8, head_dim=128, n_ctx_train=1024
)


@attrs.frozen
class Calibrated:
    rate: ComputeRate
    source: str


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
    from bmoe.runtime.session import Session
    from bmoe.runtime.session_config import SessionConfig

    try:
        path = calibration_model(quant)
        layout = read_layout(path)
        figures = model_figures(layout, layout.paths[0], str(path))
        params = ContextParams(
            n_ctx=PREFILL_TOKENS + DECODE_STEPS + 8,
            n_batch=PREFILL_TOKENS,
            n_ubatch=PREFILL_TOKENS,
            n_threads=threads,
        )
        tokens = np.random.default_rng(0).integers(16, 200, PREFILL_TOKENS).tolist()
        with Session.open(SessionConfig(model_path=path, context=params)) as session:
            ctx = session.ctx
            ctx.decode(tokens[:64], 0)  # warm: the weights paged in, the threads started
            best = float("inf")
            for _ in range(2):
                ctx.clear()
                t0 = time.perf_counter()
                ctx.decode(tokens, 0)
                best = min(best, time.perf_counter() - t0)
            steps = []
            for i in range(DECODE_STEPS):
                t0 = time.perf_counter()
                ctx.decode([tokens[i]], PREFILL_TOKENS + i)
                steps.append(time.perf_counter() - t0)
    except (BmoeError, OSError) as exc:
        return Calibrated(measure_compute(), f"numpy's f32 products (llama.cpp's could not be timed: {exc})")
    weights = figures.active_bytes / max(figures.bytes_per_weight, 1e-9)
    rate = ComputeRate(
        matvec_bytes_s=figures.active_bytes / max(float(np.median(steps)), 1e-9),
        matmul_flops=2.0 * weights * PREFILL_TOKENS / max(best, 1e-9),
    )
    return Calibrated(rate, f"llama.cpp's {quant.upper()} kernels timed here ({threads} threads)")
