"""The torch model on the held-out windows, teacher-forced: logits, routing, loss."""

from __future__ import annotations

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.bench.trained import torch_model as tm
from bmoe.bench.trained.layout import F32, TrainedDims, Weights

torch = tm.torch


@attrs.frozen(eq=False)
class HeldOut:
    logits: F32
    """``[n_seq, n_tok, n_vocab]``."""
    routed: npt.NDArray[np.int32]
    """``[n_seq, n_tok, n_layer, k]``."""
    router_inputs: F32
    """``[n_seq, n_tok, n_layer, n_embd]``."""
    loss: float
    """Mean next-token cross-entropy, nats per token."""


def run_held_out(
    dims: TrainedDims, weights: Weights, windows: npt.NDArray[np.int32], chunk: int = 4
) -> HeldOut:
    """Every window (``[n_seq, n_tok]``) from position 0, ``chunk`` windows per forward pass."""
    params = tm.to_params(weights)
    logits, routed, inputs, losses = [], [], [], []
    with torch.no_grad():
        for begin in range(0, len(windows), chunk):
            tokens = torch.from_numpy(windows[begin : begin + chunk].astype(np.int64))
            out = tm.forward(dims, params, tokens, trace=True)
            assert out.routed is not None and out.router_inputs is not None  # traced
            losses.append(float(tm.cross_entropy(out.logits[:, :-1], tokens[:, 1:])) * len(tokens))
            logits.append(out.logits.numpy())
            routed.append(out.routed.numpy().astype(np.int32))
            inputs.append(out.router_inputs.numpy())
    return HeldOut(
        logits=np.concatenate(logits).astype(np.float32),
        routed=np.concatenate(routed),
        router_inputs=np.concatenate(inputs).astype(np.float32),
        loss=sum(losses) / len(windows),
    )
