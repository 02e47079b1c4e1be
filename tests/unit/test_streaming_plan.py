"""Which models can be streamed, and the cache budget rule (no model needed)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from bmoe.adapters.expert_streaming import StreamingUnavailable, plan_projections
from bmoe.adapters.gguf_layout import ModelLayout, TensorLocation
from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.streaming import MIB, RunMemory, StreamConfig, prompt_batch, resolve_budget
from bmoe.errors import ConfigError


@attrs.frozen
class FakeModel:
    arch: str
    n_expert: int
    n_layer: int = 2


def layout(*tensors: TensorLocation) -> ModelLayout:
    return ModelLayout(paths=(Path("m.gguf"),), sizes=(1 << 20,), tensors={t.name: t for t in tensors})


def expert(name: str, n_expert: int = 4) -> TensorLocation:
    return TensorLocation(name=name, file_index=0, offset=4096, n_bytes=64 * n_expert, shape=(4, 4, n_expert))


def test_an_architecture_outside_the_registry_runs_resident_with_the_reason() -> None:
    with pytest.raises(StreamingUnavailable, match="architecture 'qwen3' is not in bmoe's expert registry"):
        plan_projections(FakeModel("qwen3", 0), layout())  # type: ignore[arg-type]


def test_a_dense_model_of_a_moe_architecture_runs_resident() -> None:
    with pytest.raises(StreamingUnavailable, match="qwen3moe model has no routed experts"):
        plan_projections(FakeModel("qwen3moe", 0), layout())  # type: ignore[arg-type]


def test_a_dense_llama_runs_resident_and_a_llama_with_experts_streams() -> None:
    """GGUF has no ``mixtral``: Mixtral is ``llama`` with experts, a dense llama has none."""
    with pytest.raises(StreamingUnavailable, match="llama model has no routed experts"):
        plan_projections(FakeModel("llama", 0), layout())  # type: ignore[arg-type]
    names, found = plan_projections(
        FakeModel("llama", 4),
        layout(expert("blk.1.ffn_down_exps.weight")),  # type: ignore[arg-type]
    )
    assert [(layer, names[p]) for layer, p, _ in found] == [(1, "ffn_down_exps")]


def test_separate_and_fused_projections_are_found_per_layer() -> None:
    found_layout = layout(
        expert("blk.0.ffn_gate_up_exps.weight"),
        expert("blk.0.ffn_down_exps.weight"),
        expert("blk.1.ffn_up_exps.weight"),
    )
    names, found = plan_projections(FakeModel("qwen35moe", 4), found_layout)  # type: ignore[arg-type]
    assert sorted((layer, names[p]) for layer, p, _ in found) == [
        (0, "ffn_down_exps"),
        (0, "ffn_gate_up_exps"),
        (1, "ffn_up_exps"),
    ]


def test_a_tensor_that_is_not_one_slice_per_expert_is_refused() -> None:
    bad = TensorLocation(
        name="blk.0.ffn_up_exps.weight", file_index=0, offset=0, n_bytes=100, shape=(5, 5, 3)
    )
    with pytest.raises(StreamingUnavailable, match=r"is not a \[\*, \*, 4\] expert tensor"):
        plan_projections(FakeModel("qwen3moe", 4), layout(bad))  # type: ignore[arg-type]


def test_budget_auto_is_available_memory_minus_a_floor_capped_and_at_least_one_cycle() -> None:
    auto = StreamConfig(enabled=True)
    roomy = RunMemory(MemoryRoom(5000 * MIB))
    assert resolve_budget(auto, memory=roomy, token_cycle_bytes=10 * MIB).bytes == 3976 * MIB
    capped = StreamConfig(enabled=True, cache_ceil_mb=2000)
    assert resolve_budget(capped, memory=roomy, token_cycle_bytes=10 * MIB).bytes == 2000 * MIB
    starved = resolve_budget(auto, memory=RunMemory(MemoryRoom(512 * MIB)), token_cycle_bytes=300 * MIB)
    assert starved.bytes == 300 * MIB and starved.auto


def test_an_explicit_budget_below_a_token_cycle_is_honoured_with_a_warning() -> None:
    small = resolve_budget(
        StreamConfig(enabled=True, cache_mb=100),
        memory=RunMemory(MemoryRoom(5000 * MIB)),
        token_cycle_bytes=300 * MIB,
    )
    assert small.bytes == 100 * MIB
    assert small.warning == (
        "cache 100 MiB is below one token's working set (300 MiB, every MoE layer's top-k experts: "
        "--cache-mb 300 holds it): the cache cycles, expect few hits"
    )
    off = resolve_budget(
        StreamConfig(enabled=True, cache_mb=0), memory=RunMemory(MemoryRoom(0)), token_cycle_bytes=300 * MIB
    )
    assert (off.bytes, off.warning) == (0, None)


def test_stream_config_validates() -> None:
    with pytest.raises(ConfigError, match="cache_mb must be >= 0"):
        StreamConfig(cache_mb=-1)
    with pytest.raises(ConfigError, match="io_threads must be >= 1"):
        StreamConfig(io_threads=0)


def test_streaming_prefills_in_big_batches_unless_told() -> None:
    assert prompt_batch(None, streaming=True, n_ctx=4096) == 512
    assert prompt_batch(None, streaming=True, n_ctx=256) == 256  # never more than the context
    assert prompt_batch(None, streaming=False, n_ctx=4096) == 64
    assert prompt_batch(32, streaming=True, n_ctx=4096) == 32  # -b overrides
    with pytest.raises(ConfigError):
        prompt_batch(0, streaming=True, n_ctx=4096)
