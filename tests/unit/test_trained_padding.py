"""The bench-scale export's padding: zero rows and zero blocks in Q4_0 bytes, the width that
gives an expert the bench model's bytes, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from bmoe.bench.trained.init import random_weights
from bmoe.bench.trained.layout import TrainedDims, layer_names
from bmoe.bench.trained.padded import BENCH_EXPERT_VALUES, bench_width, pad_columns, pad_experts, pad_rows

Q4_0 = GGMLQuantizationType.Q4_0


def test_the_bench_width_gives_an_expert_the_bench_models_values() -> None:
    assert bench_width(256) == 6144 and bench_width(256) * 256 == BENCH_EXPERT_VALUES
    assert bench_width(2048) == 768
    assert bench_width(1000) % 32 == 0


def test_zero_rows_and_blocks_dequantize_to_exact_zeros() -> None:
    values = np.random.default_rng(0).standard_normal((2, 64, 96)).astype(np.float32)
    q = np.asarray(quantize(values, Q4_0))
    rows = np.asarray(dequantize(pad_rows(q, 80), Q4_0))
    assert rows.shape == (2, 80, 96)
    assert np.array_equal(rows[:, :64], np.asarray(dequantize(q, Q4_0))) and not rows[:, 64:].any()
    columns = np.asarray(dequantize(pad_columns(q, 160), Q4_0))
    assert columns.shape == (2, 64, 160)
    assert (
        np.array_equal(columns[:, :, :96], np.asarray(dequantize(q, Q4_0))) and not columns[:, :, 96:].any()
    )


def test_padding_refuses_to_shrink_or_to_cut_a_block() -> None:
    q = np.zeros((1, 64, 54), dtype=np.uint8)  # 96 values a row
    with pytest.raises(ValueError, match="cannot pad"):
        pad_rows(q, 32)
    with pytest.raises(ValueError, match="cannot pad"):
        pad_columns(q, 64)
    with pytest.raises(ValueError, match="cannot pad"):
        pad_columns(q, 100)


def test_the_computed_experts_are_the_dequantized_trained_ones() -> None:
    dims = TrainedDims(
        n_layer=1, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, n_expert=4, n_expert_used=2, n_ff_exp=32
    )
    weights = random_weights(dims, 1)
    padded = pad_experts(dims, weights, 96)
    n = layer_names(0)
    assert padded.raw[n.gate_exps].shape == (4, 96, 64 // 32 * 18)
    assert padded.raw[n.down_exps].shape == (4, 64, 96 // 32 * 18)
    assert padded.computed[n.gate_exps].shape == weights[n.gate_exps].shape
    assert np.abs(padded.computed[n.gate_exps] - weights[n.gate_exps]).max() < 0.5
    assert np.array_equal(padded.computed[n.router], weights[n.router])  # routers stay F32
    with pytest.raises(ValueError, match="multiples of 32"):
        pad_experts(dims, weights, 100)


def test_the_check_allows_more_for_a_deeper_model() -> None:
    from bmoe.bench.trained.check import DEFAULT_TOLERANCE, depth_tolerance

    assert depth_tolerance(3) == depth_tolerance(6) == DEFAULT_TOLERANCE
    assert depth_tolerance(16) == pytest.approx(DEFAULT_TOLERANCE * 16 / 6)
