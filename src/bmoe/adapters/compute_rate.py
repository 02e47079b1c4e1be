"""The compute rates the plan's speed bounds are calibrated with: a short matrix-vector
product (the weight bytes a decode step streams through the CPU a second) and a short
matrix product (the FLOP/s a prefill's batches get), with numpy here, a fraction of a
second in all. Rough by nature: llama.cpp computes on quantized weights with its own
kernels; ``python -m bmoe.bench --plan`` prints the prediction beside what was measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import numpy as np

MATVEC_SHAPE = (4096, 4096)  # 64 MiB of f32: past the caches, as a model's weights are
MATMUL_N = 768
REPEATS = 4


@attrs.frozen
class ComputeRate:
    matvec_bytes_s: float
    matmul_flops: float


def _best(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_compute() -> ComputeRate:
    """Both rates, the best of a few repeats each."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(MATVEC_SHAPE, dtype=np.float32)
    x = rng.standard_normal(MATVEC_SHAPE[1], dtype=np.float32)
    matvec = _best(lambda: a @ x, REPEATS)
    b = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    matmul = _best(lambda: b @ b, REPEATS)
    return ComputeRate(
        matvec_bytes_s=a.nbytes / max(matvec, 1e-9),
        matmul_flops=2.0 * MATMUL_N**3 / max(matmul, 1e-9),
    )
