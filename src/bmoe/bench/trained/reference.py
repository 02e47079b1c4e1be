"""A numpy forward pass of what llama.cpp's ``qwen3moe`` graph computes, for one sequence.

Step for step as ``src/models/qwen3moe.cpp`` and ``build_moe_ffn`` do it: RMS norm
(``x / sqrt(mean(x^2) + eps) * w``), separate q/k/v projections, per-head RMS norms of
queries and keys, NeoX RoPE (the two halves of a head rotate together), causal grouped
attention (query head ``h`` reads key/value head ``h // (n_head / n_head_kv)``) scaled by
``1/sqrt(head_dim)``, residual; then RMS norm, softmax router, top-k, the top-k
probabilities renormalised to sum 1 (``norm_w``), SwiGLU experts, residual; output norm and
the LM head. Computed in float64, so it is the reference both llama.cpp (float32, F16 KV
cache) and the torch model are held to.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.bench.trained.layout import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, TrainedDims, Weights, layer_names

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]


@attrs.frozen(eq=False)
class Trace:
    """One sequence through the model."""

    logits: F32
    """``[n_tokens, n_vocab]``."""
    router_inputs: F32
    """``[n_tokens, n_layer, n_embd]``: each layer's ``ffn_norm`` output, what its router sees."""
    routed: I32
    """``[n_tokens, n_layer, n_expert_used]``: the experts each token uses, most probable first."""


def rms_norm(x: F64, weight: npt.NDArray[np.floating], eps: float) -> F64:
    """RMS norm over the last axis."""
    out: F64 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight
    return out


def rope_neox(x: F64, positions: npt.NDArray[np.integer], base: float) -> F64:
    """Rotate ``x`` ``[n_tokens, n_heads, head_dim]``: element ``i`` of the first half pairs
    with element ``i`` of the second, angle ``pos * base^(-2i/head_dim)``."""
    half = x.shape[-1] // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / x.shape[-1])
    angle = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    out: F64 = np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out


def softmax(x: F64) -> F64:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: F64 = e / e.sum(axis=-1, keepdims=True)
    return out


def top_k(probs: F64, k: int) -> npt.NDArray[np.intp]:
    """Indices of the ``k`` largest values of each row, largest first."""
    return np.argsort(-probs, axis=-1, kind="stable")[..., :k]


def attention(dims: TrainedDims, w: Weights, il: int, x: F64, positions: npt.NDArray[np.integer]) -> F64:
    """One layer's self-attention on the normed input ``x`` ``[n_tokens, n_embd]``."""
    n = layer_names(il)
    t, d = x.shape[0], dims.head_dim
    q = (x @ w[n.wq].T.astype(np.float64)).reshape(t, dims.n_head, d)
    k = (x @ w[n.wk].T.astype(np.float64)).reshape(t, dims.n_head_kv, d)
    v = (x @ w[n.wv].T.astype(np.float64)).reshape(t, dims.n_head_kv, d)
    q = rope_neox(rms_norm(q, w[n.q_norm], dims.rms_eps), positions, dims.rope_base)
    k = rope_neox(rms_norm(k, w[n.k_norm], dims.rms_eps), positions, dims.rope_base)
    group = dims.n_head // dims.n_head_kv
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    causal = np.triu(np.ones((t, t), dtype=bool), k=1)
    scores[:, causal] = -np.inf
    out = np.einsum("hqk,khd->qhd", softmax(scores), v).reshape(t, dims.n_head * d)
    projected: F64 = out @ w[n.wo].T.astype(np.float64)
    return projected


def moe(dims: TrainedDims, w: Weights, il: int, x: F64) -> tuple[F64, npt.NDArray[np.intp]]:
    """One layer's routed experts on the normed input ``x``; returns the output and the ids."""
    n = layer_names(il)
    probs = softmax(x @ w[n.router].T.astype(np.float64))
    ids = top_k(probs, dims.n_expert_used)
    chosen = np.take_along_axis(probs, ids, axis=-1)
    weight = chosen / np.maximum(chosen.sum(axis=-1, keepdims=True), 6.103515625e-5)
    out = np.zeros_like(x)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        h = x[rows]
        gate = h @ w[n.gate_exps][e].T.astype(np.float64)
        up = h @ w[n.up_exps][e].T.astype(np.float64)
        y = (gate / (1.0 + np.exp(-gate)) * up) @ w[n.down_exps][e].T.astype(np.float64)
        out[rows] += y * weight[rows, slots][:, None]
    return out, ids


def forward(dims: TrainedDims, weights: Weights, tokens: Sequence[int]) -> Trace:
    """``tokens`` at positions ``0..n-1`` (a fresh sequence)."""
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.ndim != 1 or not len(ids) or len(ids) > dims.n_ctx:
        raise ValueError(f"need 1..{dims.n_ctx} tokens, got {ids.shape}")
    positions = np.arange(len(ids))
    h = weights[TOKEN_EMBD][ids].astype(np.float64)
    router_inputs = np.empty((len(ids), dims.n_layer, dims.n_embd), dtype=np.float32)
    routed = np.empty((len(ids), dims.n_layer, dims.n_expert_used), dtype=np.int32)
    for il in range(dims.n_layer):
        n = layer_names(il)
        h = h + attention(dims, weights, il, rms_norm(h, weights[n.attn_norm], dims.rms_eps), positions)
        x = rms_norm(h, weights[n.ffn_norm], dims.rms_eps)
        out, chosen = moe(dims, weights, il, x)
        router_inputs[:, il] = x
        routed[:, il] = chosen
        h = h + out
    logits = rms_norm(h, weights[OUTPUT_NORM], dims.rms_eps) @ weights[OUTPUT].T.astype(np.float64)
    return Trace(logits=logits.astype(np.float32), router_inputs=router_inputs, routed=routed)
