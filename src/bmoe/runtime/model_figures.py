"""A model's figures for the plan (``bmoe.domain.plan.figures.ModelFigures``), read from its
GGUF header alone: the expert tensors' sizes per layer, the attention's KV width, the
context it was trained for. The plan (``bmoe.runtime.planning``) and its compute
calibration (``bmoe.runtime.compute_calibration``) both read models through it."""

from __future__ import annotations

import math
from pathlib import Path

from bmoe.adapters.gguf_layout import ModelLayout, read_header_values
from bmoe.domain.moe_arch import expert_projections, expert_tensor_name, prunes_last_ffn
from bmoe.domain.plan.figures import ModelFigures
from bmoe.errors import ConfigError

_KEYS = (
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.kv_lora_rank",
    "rope.dimension_count",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "context_length",
)


def _attention_layers(layout: ModelLayout, n_layer: int) -> int:
    """Layers with a KV cache: those with attention's K (or fused QKV, or MLA's) weights."""
    marks = ("attn_k.", "attn_qkv.", "attn_kv_a_mqa.", "attn_k_b.")
    layers = {
        int(name.split(".")[1])
        for name in layout.tensors
        if name.startswith("blk.") and any(m in name for m in marks)
    }
    return len(layers) or n_layer


def model_figures(layout: ModelLayout, first: Path, name: str) -> ModelFigures:
    """The figures of the model whose header files ``layout`` was read from (``first``:
    the first file, for its metadata). Raises ``ConfigError`` for a model bmoe cannot stream."""
    arch = str(read_header_values(first, ["general.architecture"]).get("general.architecture", ""))
    raw = read_header_values(first, [f"{arch}.{k}" for k in _KEYS])
    v = {k: int(raw[f"{arch}.{k}"]) for k in _KEYS if isinstance(raw.get(f"{arch}.{k}"), int)}
    projections = expert_projections(arch)
    n_layer, n_expert = v.get("block_count", 0), v.get("expert_count", 0)
    if projections is None or n_expert <= 1:
        why = "not in bmoe's expert registry" if projections is None else "a model without routed experts"
        raise ConfigError(f"{name}: architecture {arch!r} is {why}: there is nothing to stream or plan")
    per_layer: dict[int, int] = {}
    per_layer_weights: dict[int, int] = {}
    expert_names: set[str] = set()
    slices: list[int] = []
    weights = 0
    down = None
    for layer in range(n_layer):
        for projection in projections:
            loc = layout.tensors.get(expert_tensor_name(layer, projection))
            if loc is None or len(loc.shape) != 3 or loc.shape[2] != n_expert:
                continue
            per_layer[layer] = per_layer.get(layer, 0) + loc.n_bytes
            per_layer_weights[layer] = per_layer_weights.get(layer, 0) + math.prod(loc.shape)
            expert_names.add(loc.name)
            slices.append(loc.n_bytes // n_expert)
            weights += math.prod(loc.shape)
            if projection == "ffn_down_exps":
                down = loc
    if not per_layer:
        raise ConfigError(f"{name}: no routed-expert tensors found in this {arch} model")
    expert_bytes = sum(per_layer.values())
    k = max(1, v.get("expert_used_count", 1))
    n_embd = v.get("embedding_length", 0)
    n_head = v.get("attention.head_count", 1)
    n_head_kv = v.get("attention.head_count_kv", n_head)
    key = v.get("attention.key_length", n_embd // max(1, n_head))
    value = v.get("attention.value_length", key)
    if "attention.kv_lora_rank" in v:  # MLA: the compressed KV and the rope part, one head
        per_layer_kv = v["attention.kv_lora_rank"] + v.get("rope.dimension_count", 0)
    else:
        per_layer_kv = n_head_kv * (key + value)
    embd = layout.tensors.get("token_embd.weight")
    return ModelFigures(
        name=name,
        arch=arch,
        file_bytes=sum(layout.sizes),
        n_layer=n_layer,
        moe_layers=tuple(sorted(per_layer)),
        n_expert=n_expert,
        n_expert_used=k,
        expert_bytes=expert_bytes,
        entry_bytes=max(per_layer.values()) // n_expert,
        layer_bytes=max(per_layer.values()),
        token_cycle_bytes=sum(b // n_expert * k for b in per_layer.values()),
        read_bytes=max(slices),
        kv_bytes_per_token=2 * per_layer_kv * _attention_layers(layout, n_layer),
        n_embd=n_embd,
        n_vocab=embd.shape[1] if embd is not None and len(embd.shape) == 2 else 0,
        n_head=n_head,
        head_dim=key,
        n_attn_layers=_attention_layers(layout, n_layer),
        n_ff_exp=v.get("expert_feed_forward_length", down.shape[0] if down is not None else 0),
        n_ctx_train=v.get("context_length", 0),
        bytes_per_weight=expert_bytes / max(1, weights),
        embedding_bytes=embd.n_bytes if embd is not None and "output.weight" in layout.tensors else 0,
        prompt_weights=_prompt_weights(
            layout,
            n_layer - 1 if prunes_last_ffn(arch) else None,
            expert_names,
            per_layer_weights,
            k / n_expert,
        ),
    )


def _prompt_weights(
    layout: ModelLayout,
    skipped: int | None,
    expert_names: set[str],
    expert_weights: dict[int, int],
    share: float,
) -> int:
    """The weights one prompt token multiplies by in llama.cpp's graph: every matrix of every
    layer (attention, routers, shared and dense FFNs; not biases) and ``share`` (k of n) of
    each MoE layer's routed experts, but not the embedding table (a row is looked up) nor the
    output head (one token a batch wants logits), nor the FFN of layer ``skipped``, the last,
    where the architecture prunes there (``prunes_last_ffn``; None: none skipped). What the
    plan's prefill counts, and what its calibration reads its rates with
    (``bmoe.runtime.compute_calibration``)."""
    skipped_ffn = None if skipped is None else f"blk.{skipped}.ffn_"
    dense = sum(
        math.prod(loc.shape)
        for name, loc in layout.tensors.items()
        if name.startswith("blk.")
        and name.endswith(".weight")
        and len(loc.shape) >= 2
        and name not in expert_names
        and not (skipped_ffn is not None and name.startswith(skipped_ffn))
    )
    routed = sum(n for layer, n in expert_weights.items() if layer != skipped)
    return dense + round(routed * share)
