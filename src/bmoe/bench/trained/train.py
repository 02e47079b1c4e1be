"""Train the model for a wall-clock budget on CPU, printing progress to stderr.

Random windows of ``n_ctx + 1`` tokens (drawn from the seed), AdamW with weight decay on
the matrices only, gradient clipping, a short warm-up then a cosine decay over the *time*
budget (the number of steps depends on the machine). The loss is next-token cross-entropy
plus ``balance_coef`` times the load-balancing loss, which keeps routing from collapsing
onto a few experts.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.bench.trained import torch_model as tm
from bmoe.bench.trained.layout import F32, TrainedDims, Weights
from bmoe.bench.trained.torchlib import Tensor

torch = tm.torch


@attrs.frozen
class TrainConfig:
    minutes: float = 6.0
    seed: int = 0
    batch: int = 8
    lr: float = 3e-3
    min_lr_share: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    balance_coef: float = 0.01
    clip: float = 1.0
    threads: int = 2
    report_every_s: float = 5.0


@attrs.frozen(eq=False)
class TrainResult:
    weights: dict[str, F32]
    steps: int
    tokens: int
    seconds: float
    loss: float
    """Mean next-token loss (nats) of the last steps (about the last report interval)."""
    balance_loss: float


def learning_rate(config: TrainConfig, step: int, elapsed_share: float) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from ``lr`` to ``min_lr_share * lr``
    as the time budget runs out."""
    warm = min(1.0, (step + 1) / config.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, elapsed_share)))
    return config.lr * warm * (config.min_lr_share + (1.0 - config.min_lr_share) * cosine)


def _batch(ids: npt.NDArray[np.int32], rng: np.random.Generator, batch: int, length: int) -> Tensor:
    starts = rng.integers(0, len(ids) - length, size=batch)
    return torch.from_numpy(np.stack([ids[s : s + length] for s in starts]).astype(np.int64))


def train(
    dims: TrainedDims,
    initial: Weights,
    train_ids: npt.NDArray[np.int32],
    config: TrainConfig,
    *,
    log: TextIO = sys.stderr,
) -> TrainResult:
    """Train from ``initial`` on ``train_ids`` until ``config.minutes`` of wall time are used."""
    if len(train_ids) <= dims.n_ctx + 1:
        raise ValueError(f"{len(train_ids)} training tokens hold no window of {dims.n_ctx + 1}")
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    params = tm.to_params(initial, requires_grad=True)
    matrices = [p for p in params.values() if p.ndim >= 2]
    vectors = [p for p in params.values() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": config.weight_decay}, {"params": vectors, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    budget = config.minutes * 60.0
    start = time.monotonic()
    last_report = start
    step = tokens = 0
    recent: list[tuple[float, float]] = []
    loss_value = balance_value = float("nan")
    while (elapsed := time.monotonic() - start) < budget:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step, elapsed / budget)
        batch = _batch(train_ids, rng, config.batch, dims.n_ctx + 1)
        out = tm.forward(dims, params, batch[:, :-1])
        loss = tm.cross_entropy(out.logits, batch[:, 1:])
        total = loss + config.balance_coef * out.balance_loss
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), config.clip)
        optimizer.step()
        step += 1
        tokens += config.batch * dims.n_ctx
        recent.append((float(loss.detach()), float(out.balance_loss.detach())))
        now = time.monotonic()
        if now - last_report >= config.report_every_s:
            loss_value = float(np.mean([r[0] for r in recent]))
            balance_value = float(np.mean([r[1] for r in recent]))
            print(
                f"train {now - start:6.0f}/{budget:.0f}s  step {step:5d}  {tokens / 1e6:6.2f}M tokens  "
                f"loss {loss_value:.3f}  balance {balance_value:.3f}  "
                f"lr {optimizer.param_groups[0]['lr']:.1e}  {tokens / (now - start):,.0f} tok/s",
                file=log,
                flush=True,
            )
            recent = []
            last_report = now
    if recent:
        loss_value = float(np.mean([r[0] for r in recent]))
        balance_value = float(np.mean([r[1] for r in recent]))
    return TrainResult(
        weights=tm.to_weights(params),
        steps=step,
        tokens=tokens,
        seconds=time.monotonic() - start,
        loss=loss_value,
        balance_loss=balance_value,
    )
