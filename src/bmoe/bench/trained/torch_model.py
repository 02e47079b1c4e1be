"""The same ``qwen3moe`` forward pass as :mod:`bmoe.bench.trained.reference`, in torch, batched
and differentiable: what training optimises and what the figures are computed from.

Parameters are a flat dict keyed by the GGUF tensor names (:mod:`~bmoe.bench.trained.layout`),
so weights go from numpy to torch and back without a mapping. The routed experts run sparse:
the ``n_tok * k`` (token, slot) pairs are sorted by expert and each expert multiplies only
its rows. Alongside the logits comes a Switch-Transformer load-balancing loss per layer
(``n_expert * sum_e f_e * P_e``: the share of slots routed to expert ``e`` times its mean
router probability), which is 1 when routing is uniform and grows as it collapses.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from bmoe.bench.trained.layout import F32, OUTPUT, OUTPUT_NORM, TOKEN_EMBD, TrainedDims, Weights, layer_names
from bmoe.bench.trained.torchlib import Tensor, load_torch

torch = load_torch()
functional = torch.nn.functional

Params = dict[str, Tensor]


def to_params(weights: Weights, *, requires_grad: bool = False) -> Params:
    """float32 torch tensors of ``weights`` (copies)."""
    return {
        name: torch.tensor(np.asarray(array, dtype=np.float32), requires_grad=requires_grad)
        for name, array in weights.items()
    }


def to_weights(params: Params) -> dict[str, F32]:
    """numpy copies of ``params``."""
    return {name: p.detach().cpu().numpy().astype(np.float32, copy=True) for name, p in params.items()}


@attrs.frozen(eq=False)
class Output:
    """A batch ``[n_seq, n_tok]`` through the model."""

    logits: Tensor
    """``[n_seq, n_tok, n_vocab]``."""
    balance_loss: Tensor
    """Mean over layers of the load-balancing loss (a scalar)."""
    router_inputs: Tensor | None
    """``[n_seq, n_tok, n_layer, n_embd]`` when traced, else None."""
    routed: Tensor | None
    """``[n_seq, n_tok, n_layer, k]`` expert ids, most probable first, when traced."""


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_tables(dims: TrainedDims, n_tok: int) -> tuple[Tensor, Tensor]:
    """cos and sin of the NeoX rotation, ``[n_tok, 1, head_dim/2]`` each."""
    half = dims.head_dim // 2
    inv_freq = dims.rope_base ** (-torch.arange(half, dtype=torch.float64) * 2.0 / dims.head_dim)
    angle = torch.arange(n_tok, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angle.cos().float()[:, None, :], angle.sin().float()[:, None, :]


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` ``[n_seq, n_tok, n_head, head_dim]``: the two halves of a head pair up."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)


def attention(dims: TrainedDims, p: Params, il: int, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    n = layer_names(il)
    b, t, d = x.shape[0], x.shape[1], dims.head_dim
    q = (x @ p[n.wq].T).view(b, t, dims.n_head, d)
    k = (x @ p[n.wk].T).view(b, t, dims.n_head_kv, d)
    v = (x @ p[n.wv].T).view(b, t, dims.n_head_kv, d)
    q = rope(rms_norm(q, p[n.q_norm], dims.rms_eps), cos, sin)
    k = rope(rms_norm(k, p[n.k_norm], dims.rms_eps), cos, sin)
    group = dims.n_head // dims.n_head_kv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    out = functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=1.0 / math.sqrt(d)
    )
    return out.transpose(1, 2).reshape(b, t, dims.n_head * d) @ p[n.wo].T


def moe(dims: TrainedDims, p: Params, il: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Routed experts on the normed ``x`` ``[n, n_embd]``: output, expert ids ``[n, k]``, and
    the layer's load-balancing loss."""
    n = layer_names(il)
    k, n_expert = dims.n_expert_used, dims.n_expert
    probs = functional.softmax(x @ p[n.router].T, dim=-1)
    top_p, ids = probs.topk(k, dim=-1)
    weight = top_p / top_p.sum(dim=-1, keepdim=True).clamp_min(6.103515625e-5)
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=n_expert)
    rows = order // k
    chunks = []
    for e, h in enumerate(torch.split(x[rows], counts.tolist())):
        if h.shape[0]:
            gate = h @ p[n.gate_exps][e].T
            up = h @ p[n.up_exps][e].T
            chunks.append((functional.silu(gate) * up) @ p[n.down_exps][e].T)
    y = torch.cat(chunks) * weight.reshape(-1)[order][:, None]
    out = torch.zeros_like(x).index_add(0, rows, y)
    share = counts.to(x.dtype) / flat.numel()
    balance = n_expert * (share * probs.mean(dim=0)).sum()
    return out, ids, balance


def forward(dims: TrainedDims, p: Params, tokens: Tensor, *, trace: bool = False) -> Output:
    """``tokens`` ``[n_seq, n_tok]`` (int64), each sequence from position 0."""
    b, t = tokens.shape
    if t > dims.n_ctx:
        raise ValueError(f"{t} tokens exceed the context of {dims.n_ctx}")
    cos, sin = rope_tables(dims, t)
    h = p[TOKEN_EMBD][tokens]
    inputs, routed, balances = [], [], []
    for il in range(dims.n_layer):
        n = layer_names(il)
        h = h + attention(dims, p, il, rms_norm(h, p[n.attn_norm], dims.rms_eps), cos, sin)
        x = rms_norm(h, p[n.ffn_norm], dims.rms_eps).reshape(b * t, dims.n_embd)
        out, ids, balance = moe(dims, p, il, x)
        balances.append(balance)
        if trace:
            inputs.append(x.detach().view(b, t, dims.n_embd))
            routed.append(ids.view(b, t, dims.n_expert_used))
        h = h + out.view(b, t, dims.n_embd)
    logits = rms_norm(h, p[OUTPUT_NORM], dims.rms_eps) @ p[OUTPUT].T
    return Output(
        logits=logits,
        balance_loss=torch.stack(balances).mean(),
        router_inputs=torch.stack(inputs, dim=2) if trace else None,
        routed=torch.stack(routed, dim=2) if trace else None,
    )


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy (nats) of ``logits`` ``[n_seq, n_tok, n_vocab]`` on ``targets``
    ``[n_seq, n_tok]``."""
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
