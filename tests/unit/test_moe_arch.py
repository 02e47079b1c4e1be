"""The expert-tensor registry (``bmoe.domain.moe_arch``): keyed by GGUF names, both layouts."""

from __future__ import annotations

import gguf
import pytest

from bmoe.domain.moe_arch import (
    ARCHS,
    EXPERT_PROJECTIONS,
    FUSED,
    SEPARATE,
    expert_projections,
    expert_tensor_name,
)


def test_every_registry_key_is_an_architecture_name_gguf_files_carry() -> None:
    """``mixtral`` is no GGUF architecture (Mixtral files say ``llama``): a key that no file
    can carry would never match."""
    gguf_names = set(gguf.MODEL_ARCH_NAMES.values())
    assert set(ARCHS) <= gguf_names, set(ARCHS) - gguf_names
    assert "mixtral" not in ARCHS and "llama" in ARCHS


def test_the_projection_map_is_the_registry_s() -> None:
    assert dict(EXPERT_PROJECTIONS) == {name: arch.projections for name, arch in ARCHS.items()}
    assert all(name == arch.arch for name, arch in ARCHS.items())
    for arch in ARCHS.values():
        assert arch.projections in (SEPARATE, FUSED), arch.arch
        assert not set(arch.shared) & set(arch.projections), arch.arch


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_listed_architecture_accepts_both_layouts_its_own_first(arch: str) -> None:
    names = expert_projections(arch)
    assert names is not None
    assert names[: len(ARCHS[arch].projections)] == ARCHS[arch].projections
    assert set(names) == set(SEPARATE) | set(FUSED) and len(names) == 4


def test_an_unlisted_architecture_has_no_projections() -> None:
    assert expert_projections("qwen3") is None
    assert expert_projections("mixtral") is None


def test_expert_tensor_names_follow_gguf() -> None:
    assert expert_tensor_name(3, "ffn_gate_up_exps") == "blk.3.ffn_gate_up_exps.weight"
