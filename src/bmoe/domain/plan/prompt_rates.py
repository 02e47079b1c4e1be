"""The rates a prompt's compute is counted at, from one calibration of this machine.

A prompt's time is its weights' products (FLOP/s read off a curve by the tokens each expert
of a batch computes on) plus its attention scores (FLOP/s of their own). Both come out of a
few seconds of timings (``bmoe.runtime.compute_calibration``): a curve's points and a slope,
which move between calibrations more than the calibration's total time does (the 16-layer
bench model's 2,048-token prefill came out 30.7, 30.8 and 59.1 s from three calibrations
within the hour, the run 40.6 s). So the plan counts the prompt with today's rates and with
each of this machine's recent calibrations' (``compute_spread.recent_rates``), and its range
spans them all.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from bmoe.domain.plan.figures import ModelFigures


@attrs.frozen
class PromptRates:
    """``matmul_curve``: the products' FLOP/s by the tokens each expert computes on
    (ascending; empty where none was timed); ``attention_flops_s``: the attention scores'
    FLOP/s (0: not measured)."""

    matmul_curve: tuple[tuple[float, float], ...] = ()
    attention_flops_s: float = 0.0

    def matmul_flops_at(self, tokens_per_expert: float, default: float = 0.0) -> float:
        """The curve at ``tokens_per_expert``: a straight line between its points, its ends
        beyond them (``default`` where there is no curve)."""
        return curve_at(self.matmul_curve, tokens_per_expert, default)


def curve_at(curve: tuple[tuple[float, float], ...], x: float, default: float = 0.0) -> float:
    """``curve`` (ascending ``(x, y)`` points) at ``x``: interpolated between its points, its
    first or last value beyond them, ``default`` where it is empty."""
    if not curve:
        return default
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


def prompt_compute_s(
    model: ModelFigures, rates: PromptRates, tokens: int, batch: int, default_flops: float
) -> float:
    """A prompt's compute at ``rates``: its weights' products at the curve's FLOP/s for the
    tokens each expert of a batch computes on (``default_flops`` without a curve), plus its
    attention scores where their rate was measured."""
    flops = rates.matmul_flops_at(batch * model.n_expert_used / max(1, model.n_expert), default_flops)
    compute = 2.0 * model.prompt_token_weights * tokens / flops if flops > 0 else math.inf
    if rates.attention_flops_s > 0:
        compute += model.attention_flops(tokens, batch) / rates.attention_flops_s
    return compute
