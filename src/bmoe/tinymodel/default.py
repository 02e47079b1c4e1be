"""The built-in default model: what ``python -m bmoe.cli`` runs on when no ``-m`` is given.

A ``qwen3moe`` of 4 layers, 8 experts (top-2) and random weights from seed 0,
generated on first use and cached (:mod:`bmoe.tinymodel.cache`): the test
fixture ``qwen3moe`` is the same spec, so both share one cached file.
"""

from __future__ import annotations

from pathlib import Path

from bmoe.tinymodel.archs import qwen3moe
from bmoe.tinymodel.cache import cached_model
from bmoe.tinymodel.spec import FixtureSpec, MoeDims

DEFAULT_SPEC = FixtureSpec(
    name="qwen3moe",
    arch=qwen3moe.ARCH,
    dims=MoeDims(
        n_layer=4,
        n_embd=128,
        n_head=4,
        n_head_kv=2,
        head_dim=32,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=64,
    ),
    description="attention + MoE (Qwen3-MoE layout), F32, expert slices of 32 KiB",
)
"""The default model's spec (also the ``qwen3moe`` test fixture and the base of its variants)."""

DEFAULT_SEED = 0


def default_model_path() -> Path:
    """Path of the default model's GGUF, generating it on first use (cached per machine)."""
    return cached_model(DEFAULT_SPEC, qwen3moe, DEFAULT_SEED)
