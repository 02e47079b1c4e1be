"""Which tensors hold routed experts, per architecture (one registry).

Keyed by what a GGUF file says (``general.architecture``), never by a model's marketing
name: Mixtral files are ``llama`` files with ``llama.expert_count`` > 0, and a ``llama``
file without experts is a dense model that runs resident ("no routed experts").

Each routed-expert projection is a 3-D tensor ``blk.L.<name>.weight`` of shape
``[n_in, n_out, n_expert]``; expert ``e``'s slice is ``nb[2]`` bytes at ``e * nb[2]``.
Everything else (attention, norms, router, shared experts, per-expert biases and scales,
leading dense layers) stays resident. An architecture not listed here runs resident, with a
line saying so. Every entry has a generated tiny fixture and the streaming gates
(``tests/gates/test_arch_gates.py`` fails for an entry without one); docs/models.md
describes each.
"""

from __future__ import annotations

from types import MappingProxyType

import attrs

SEPARATE = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
FUSED = ("ffn_gate_up_exps", "ffn_down_exps")
_SHEXP = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


@attrs.frozen
class MoeArch:
    """One streamable GGUF architecture."""

    arch: str
    """``general.architecture`` as GGUF files write it."""
    family: str
    """The model families that ship in it (for people, not code)."""
    projections: tuple[str, ...]
    """The routed-expert tensors as llama.cpp's converter writes them (either layout is
    accepted in a file: see :func:`expert_projections`)."""
    shared: tuple[str, ...] = ()
    """Shared-expert tensors (resident, always computed)."""
    dense_layers: str = ""
    """Which layers have no routed experts, if any (resident)."""
    prunes_last_ffn: bool = False
    """llama.cpp's graph keeps only the rows that want logits (one a prompt batch) before
    the last layer's FFN, so a prompt runs that layer's experts for one token a batch (the
    plan's prefill counts it: ``ModelFigures.prompt_weights``). Set only where a fixture
    gates it (tests/gates/test_route_recorder.py); elsewhere the plan counts the layer whole."""
    gathers_by_id: bool = False
    """Besides the router's weights and the experts' matrices, llama.cpp's graph reads a
    per-expert tensor by routing id (gpt-oss's biases through ``ADD_ID``, gemma4's
    down-projection scales through a second ``GET_ROWS``): experts cannot live in other
    rows than their own (``cext/stream/rows.pxi`` faults; gated in
    tests/gates/test_expert_rows_gates.py)."""


_ARCHS = (
    MoeArch("qwen3moe", "Qwen3-MoE (30B-A3B, 235B-A22B), Qwen3-Coder", SEPARATE, prunes_last_ffn=True),
    MoeArch("qwen3vlmoe", "Qwen3-VL MoE (30B-A3B, 235B-A22B); images with its --mmproj", SEPARATE),
    MoeArch(
        "qwen2moe",
        "Qwen1.5-MoE, Qwen2-MoE (57B-A14B)",
        SEPARATE,
        shared=(*_SHEXP, "ffn_gate_inp_shexp"),
    ),
    MoeArch(
        "qwen35moe",
        "Qwen3.5/3.6 MoE (hybrid gated delta net + attention)",
        FUSED,
        shared=(*_SHEXP, "ffn_gate_inp_shexp"),
    ),
    MoeArch("gpt-oss", "OpenAI gpt-oss (20B, 120B)", SEPARATE, gathers_by_id=True),
    MoeArch("olmoe", "OLMoE (1B-7B)", SEPARATE),
    MoeArch("llama", "Mixtral 8x7B / 8x22B (llama with llama.expert_count > 0)", SEPARATE),
    MoeArch(
        "deepseek2",
        "DeepSeek-V2/V2.5/V3/R1, Kimi K2, GLM-4.7-Flash (MLA attention)",
        SEPARATE,
        shared=_SHEXP,
        dense_layers="the first leading_dense_block_count layers",
    ),
    MoeArch(
        "glm4moe",
        "GLM-4.5, GLM-4.5-Air, GLM-4.6",
        SEPARATE,
        shared=_SHEXP,
        dense_layers="the first leading_dense_block_count layers",
    ),
    MoeArch(
        "gemma4",
        "Gemma 4 MoE (26B-A4B)",
        FUSED,
        shared=("ffn_gate", "ffn_up", "ffn_down"),
        dense_layers="layers without ffn_gate_inp",
        gathers_by_id=True,
    ),
    MoeArch("granitemoe", "IBM Granite 3.x MoE (1B-A400M, 3B-A800M)", SEPARATE),
    MoeArch(
        "dots1",
        "rednote dots.llm1",
        SEPARATE,
        shared=_SHEXP,
        dense_layers="the first leading_dense_block_count layers",
    ),
    MoeArch("hunyuan-moe", "Tencent Hunyuan-A13B", SEPARATE, shared=_SHEXP),
    MoeArch(
        "bailingmoe2",
        "inclusionAI Ling 2.0 / Ring 2.0",
        SEPARATE,
        shared=_SHEXP,
        dense_layers="the first leading_dense_block_count layers",
    ),
    MoeArch(
        "ernie4_5-moe",
        "Baidu ERNIE 4.5 MoE (21B-A3B, 300B-A47B)",
        SEPARATE,
        shared=_SHEXP,
        dense_layers="the first leading_dense_block_count layers",
    ),
)

ARCHS: MappingProxyType[str, MoeArch] = MappingProxyType({a.arch: a for a in _ARCHS})
"""Every streamable architecture by its GGUF name."""

EXPERT_PROJECTIONS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {a.arch: a.projections for a in _ARCHS}
)


def expert_projections(arch: str) -> tuple[str, ...] | None:
    """The expert projection names of ``arch`` (some may be absent in a given file: a model
    may store gate and up fused or apart), or None for an architecture bmoe cannot stream."""
    if arch not in EXPERT_PROJECTIONS:
        return None
    names = EXPERT_PROJECTIONS[arch]
    # either layout may occur in files of a listed arch: accept both
    return tuple(dict.fromkeys((*names, *FUSED, *SEPARATE)))


def prunes_last_ffn(arch: str) -> bool:
    """Whether a prompt runs ``arch``'s last FFN for one token a batch (``MoeArch``)."""
    entry = ARCHS.get(arch)
    return entry is not None and entry.prunes_last_ffn


def serves_expert_rows(arch: str) -> bool:
    """Whether ``arch``'s experts may live in other rows than their own, their routing ids
    rewritten to rows (``MoeArch.gathers_by_id`` unset)."""
    entry = ARCHS.get(arch)
    return entry is not None and not entry.gathers_by_id


def expert_tensor_name(layer: int, projection: str) -> str:
    return f"blk.{layer}.{projection}.weight"
