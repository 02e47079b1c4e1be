"""Random initial weights from a seed, in numpy: where training starts, and the untrained
baseline whose routing the figures compare against.

Drawn like the tiny models' (:class:`bmoe.tinymodel.weights.WeightInit`: one stream per
tensor name, matrices ``N(0, 1/fan_in)``, embedding rows of RMS 1, norm weights 1), except
that the projections writing into the residual stream (``attn_output``, ``ffn_down_exps``)
are scaled down by ``sqrt(2 * n_layer)``, as GPT-2 does, so a deep stack starts stable.
"""

from __future__ import annotations

import math

from bmoe.bench.trained.layout import F32, TOKEN_EMBD, TrainedDims, expected_shapes, layer_names
from bmoe.tinymodel.weights import WeightInit


def random_weights(dims: TrainedDims, seed: int) -> dict[str, F32]:
    """Every tensor of the model, drawn from ``seed`` (same seed, same values)."""
    init = WeightInit(seed)
    names = [layer_names(il) for il in range(dims.n_layer)]
    residual = {n.wo for n in names} | {n.down_exps for n in names}
    out: dict[str, F32] = {}
    for name, shape in expected_shapes(dims).items():
        if name == TOKEN_EMBD:
            out[name] = init.normal(name, shape, std=1.0)
        elif len(shape) == 1:
            out[name] = init.ones(shape)
        elif name in residual:
            out[name] = init.normal(name, shape, std=1.0 / math.sqrt(shape[-1] * 2 * dims.n_layer))
        else:
            out[name] = init.matrix(name, shape)
    return out
