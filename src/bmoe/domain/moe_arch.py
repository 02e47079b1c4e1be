"""Which tensors hold routed experts, per architecture (one registry).

Each routed-expert projection is a 3-D tensor ``blk.L.<name>.weight`` of shape
``[n_in, n_out, n_expert]``; expert ``e``'s slice is ``nb[2]`` bytes at ``e * nb[2]``.
Everything else (attention, norms, router, shared experts, per-expert biases and scales)
stays resident. An architecture not listed here runs resident, with a line saying so.
"""

from __future__ import annotations

from types import MappingProxyType

_SEPARATE = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_FUSED = ("ffn_gate_up_exps", "ffn_down_exps")

EXPERT_PROJECTIONS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        "qwen3moe": _SEPARATE,
        "qwen2moe": _SEPARATE,
        "qwen35moe": _FUSED,
        "gpt-oss": _SEPARATE,
        "olmoe": _SEPARATE,
        "mixtral": _SEPARATE,
        "deepseek2": _SEPARATE,
        "glm4moe": _SEPARATE,
        "gemma4": _FUSED,
    }
)


def expert_projections(arch: str) -> tuple[str, ...] | None:
    """The expert projection names of ``arch`` (some may be absent in a given file: a model
    may store gate and up fused or apart), or None for an architecture bmoe cannot stream."""
    if arch not in EXPERT_PROJECTIONS:
        return None
    names = EXPERT_PROJECTIONS[arch]
    # either layout may occur in files of a listed arch: accept both
    return tuple(dict.fromkeys((*names, *_FUSED, *_SEPARATE)))


def expert_tensor_name(layer: int, projection: str) -> str:
    return f"blk.{layer}.{projection}.weight"
