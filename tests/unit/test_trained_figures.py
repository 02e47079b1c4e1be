"""The trained-model tool's routing figures, on hand-made routings with known answers (numpy
only, no torch): LRU hit rate, stale-gate agreement, previous-token overlap, balance; and
the held-out text they are computed on (split, windows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bmoe.bench.trained import figures as fg
from bmoe.bench.trained.corpus import Source, build_corpus, docstrings
from bmoe.bench.trained.table import layer_table, summary_table
from bmoe.bench.trained.tokens import spread_windows, tokenize
from bmoe.tinymodel.tokenizer import encode


def routed(*seqs: list[list[list[int]]]) -> np.ndarray:
    """``routed(seq, ...)``: each seq a list of tokens, each token a list of layers' ids."""
    return np.array(seqs, dtype=np.int32)


def one_layer(*ids: int) -> np.ndarray:
    """One sequence, one layer, top-1: the ids in token order."""
    return routed([[[i]] for i in ids])


# -- LRU ---------------------------------------------------------------------------------------


def test_lru_of_one_entry_hits_only_repeats() -> None:
    # 4 experts, 25%: one entry
    f = fg.lru_hit_rate(one_layer(0, 0, 1, 1, 0), n_expert=4, share=0.25)
    assert f.mean == pytest.approx(2 / 5)
    assert f.per_layer == (pytest.approx(2 / 5),)


def test_lru_evicts_the_least_recently_used_entry() -> None:
    # two entries: 0 1 0 2 (evicts 1, not 0) 0 -> miss miss hit miss hit
    assert fg.lru_hit_rate(one_layer(0, 1, 0, 2, 0), 4, 0.5).mean == pytest.approx(2 / 5)
    # 0 1 2 (evicts 0) 0 (miss, evicts 1) -> no hit
    assert fg.lru_hit_rate(one_layer(0, 1, 2, 0), 4, 0.5).mean == 0.0


def test_lru_cache_is_global_over_layers_and_sequences() -> None:
    # 2 layers x 2 experts, 50% = 2 entries shared by both layers; the second sequence
    # finds what the first left
    ids = routed([[[0], [1]]], [[[0], [1]]])
    f = fg.lru_hit_rate(ids, n_expert=2, share=0.5)
    assert f.mean == pytest.approx(0.5)
    assert f.per_layer == (pytest.approx(0.5), pytest.approx(0.5))
    # one entry for two layers: they evict each other
    assert fg.lru_hit_rate(ids, n_expert=2, share=0.25).mean == 0.0


def test_lru_counts_every_slot_of_a_top_k_request() -> None:
    ids = routed([[[0, 1]], [[1, 2]]])  # k = 2, one layer of 4 experts, cache of 2
    assert fg.lru_hit_rate(ids, 4, 0.5).mean == pytest.approx(1 / 4)


# -- stale gate ---------------------------------------------------------------------------------


def _gates(n_layer: int) -> np.ndarray:
    """Routers over 2-D inputs whose top-1 is expert 2 for input (1, 0) and expert 3 for (0, 1)."""
    gate = np.zeros((4, 2), dtype=np.float32)
    gate[2, 0] = 5.0
    gate[3, 1] = 5.0
    gate[1] = (1.0, 1.0)  # second everywhere
    return np.stack([gate] * n_layer)


def test_stale_gate_applies_the_next_router_to_this_layers_input() -> None:
    # every token's layer-0 input is (1, 0): gate_1 predicts expert 2; the real layer-1
    # experts are 2 then 3 -> half the slots agree
    inputs = np.zeros((1, 2, 2, 2), dtype=np.float32)
    inputs[:, :, 0] = (1.0, 0.0)
    inputs[:, :, 1] = (0.0, 1.0)
    ids = routed([[[0], [2]], [[0], [3]]])
    f = fg.stale_gate_agreement(inputs, _gates(2), ids, depth=1)
    assert f.per_layer == (None, pytest.approx(0.5))
    assert f.mean == pytest.approx(0.5)


def test_stale_gate_compares_sets_of_k_slots() -> None:
    inputs = np.zeros((1, 1, 2, 2), dtype=np.float32)
    inputs[..., 0] = 1.0  # (1, 0) at both layers: gate_1's top-2 is {2, 1}
    agree = fg.stale_gate_agreement(inputs, _gates(2), routed([[[0, 1], [1, 2]]]), 1)
    assert agree.mean == 1.0  # order does not matter
    half = fg.stale_gate_agreement(inputs, _gates(2), routed([[[0, 1], [2, 3]]]), 1)
    assert half.mean == pytest.approx(0.5)


def test_stale_gate_at_depth_two_skips_a_layer() -> None:
    inputs = np.zeros((1, 1, 3, 2), dtype=np.float32)
    inputs[:, :, 0] = (0.0, 1.0)  # gate_2 on layer 0's input -> expert 3
    inputs[:, :, 1] = (1.0, 0.0)  # gate_2 on layer 1's input would say 2
    ids = routed([[[0], [0], [3]]])
    f = fg.stale_gate_agreement(inputs, _gates(3), ids, depth=2)
    assert f.per_layer == (None, None, 1.0)
    assert fg.stale_gate_agreement(inputs, _gates(3), ids, depth=1).per_layer == (None, 0.0, 0.0)


def test_stale_gate_refuses_mismatched_arrays() -> None:
    with pytest.raises(ValueError, match="disagree"):
        fg.stale_gate_agreement(np.zeros((1, 1, 3, 2)), _gates(2), routed([[[0], [0]]]), 1)
    with pytest.raises(ValueError, match="depth"):
        fg.stale_gate_agreement(np.zeros((1, 1, 2, 2)), _gates(2), routed([[[0], [0]]]), 0)


# -- previous token ------------------------------------------------------------------------------


def test_previous_token_overlap_is_the_share_of_slots_reused() -> None:
    ids = routed([[[0, 1]], [[1, 2]], [[1, 2]]])  # 1 of 2, then 2 of 2
    f = fg.previous_token_overlap(ids, n_expert=4)
    assert f.mean == pytest.approx(0.75)
    assert f.per_layer == (pytest.approx(0.75),)


def test_previous_token_overlap_does_not_cross_sequences() -> None:
    ids = routed([[[0]], [[1]]], [[[1]], [[1]]])  # seq 1: 0 then 1; seq 2: 1 then 1
    assert fg.previous_token_overlap(ids, n_expert=2).mean == pytest.approx(0.5)


def test_previous_token_overlap_per_layer() -> None:
    ids = routed([[[0], [0]], [[0], [1]]])
    assert fg.previous_token_overlap(ids, n_expert=2).per_layer == (1.0, 0.0)


# -- balance -------------------------------------------------------------------------------------


def test_balance_of_even_and_collapsed_usage() -> None:
    even = routed([[[0]], [[1]], [[2]], [[3]]])
    collapsed = routed([[[2]], [[2]], [[2]], [[2]]])
    inputs = np.zeros((1, 4, 1, 2), dtype=np.float32)
    gates = np.zeros((1, 4, 2), dtype=np.float32)  # uniform router probabilities
    b = fg.balance(even, inputs, gates)
    assert b.usage_entropy == (pytest.approx(1.0),)
    assert b.max_load == (pytest.approx(1.0),)
    assert b.token_entropy == (pytest.approx(1.0),)
    c = fg.balance(collapsed, inputs, gates)
    assert c.usage_entropy == (pytest.approx(0.0),)
    assert c.max_load == (pytest.approx(4.0),)


def test_a_confident_router_has_low_token_entropy() -> None:
    inputs = np.ones((1, 1, 1, 2), dtype=np.float32)
    gates = np.zeros((1, 4, 2), dtype=np.float32)
    gates[0, 1] = 50.0
    assert fg.balance(routed([[[1]]]), inputs, gates).token_entropy[0] < 1e-6


# -- uniform random routing, all figures together -------------------------------------------------


def test_uniform_random_routing_scores_chance() -> None:
    rng = np.random.default_rng(0)
    n_seq, n_tok, n_layer, n_expert, k, n_embd = 4, 200, 4, 16, 2, 8
    ids = np.concatenate([fg.uniform_routing(n_tok, n_layer, n_expert, k, seed=s) for s in range(1, 5)])
    inputs = rng.standard_normal((n_seq, n_tok, n_layer, n_embd)).astype(np.float32)
    gates = rng.standard_normal((n_layer, n_expert, n_embd)).astype(np.float32)
    f = fg.figures(ids, inputs, gates)
    chance = fg.uniform_chance(n_expert, k, n_layer)
    assert 0.40 < chance["lru 50%"] < 0.5  # LRU under cyclic layer order: a bit under the share
    assert f.n_tokens == n_seq * n_tok
    for share in ("25%", "50%"):
        assert f.lru[share].mean == pytest.approx(chance[f"lru {share}"], abs=0.03)
    for depth in ("1", "2"):
        assert f.stale_gate[depth].mean == pytest.approx(chance["stale_gate"], abs=0.03)
    assert f.previous_token.mean == pytest.approx(chance["previous_token"], abs=0.03)
    assert min(f.balance.usage_entropy) > 0.98
    json = f.as_json()
    assert set(json) == {"lru", "stale_gate", "previous_token", "balance", "n_tokens"}
    assert json["lru"]["25%"]["mean"] == f.lru["25%"].mean


def test_the_tables_show_every_model_and_layer() -> None:
    rng = np.random.default_rng(1)
    ids = np.argsort(rng.random((2, 10, 3, 8)), axis=-1)[..., :2]
    f = fg.figures(ids, rng.standard_normal((2, 10, 3, 4)), rng.standard_normal((3, 8, 4)))
    summary = summary_table({"a": f, "b": f}, fg.uniform_chance(8, 2, 3, n_tokens=20))
    assert "| figure | a | b | uniform random routing |" in summary
    assert "stale-gate slot agreement, depth 2" in summary
    layers = layer_table(f).splitlines()
    assert len(layers) == 2 + 3
    assert layers[2].startswith("| 0 |") and "| - | - |" in layers[2]  # no stale gate at layer 0


def test_ids_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="expert ids"):
        fg.previous_token_overlap(one_layer(0, 4), n_expert=4)
    with pytest.raises(ValueError, match="n_seq, n_tok, n_layer, k"):
        fg.lru_hit_rate(np.zeros((3, 1), dtype=np.int32), 4, 0.5)


# -- the held-out text -----------------------------------------------------------------------------


def test_each_file_goes_whole_to_one_split_within_the_caps() -> None:
    sources = [Source(Path(f"/doc/file{i}.txt"), f"text {i} " * 50) for i in range(60)]
    corpus = build_corpus(sources, ["/doc"], train_cap=2_000, held_out_cap=10_000)
    held = [s for s in sources if s.held_out]
    assert held and len(held) < len(sources)
    assert corpus.held_out == "\n".join(s.text for s in held)
    assert len(corpus.train) <= 2_000 + corpus.n_train_files
    assert all(s.text not in corpus.train for s in held)
    assert "bytes of training text" in corpus.text()


def test_docstrings_are_taken_not_code() -> None:
    source = (
        '"""Module doc."""\n\nclass A:\n    """Class doc."""\n\n'
        '    def f(self):\n        """F doc."""\n        return 1\n'
    )
    assert docstrings(source) == "Module doc.\n\nClass doc.\n\nF doc."
    assert docstrings("def (:") == ""


def test_tokenize_gives_the_tokenizers_ids() -> None:
    text = "The router picks 4 of 32 experts; the cache keeps 25% of them.\n    Indented, too."
    assert tokenize(text).tolist() == encode(text)


def test_windows_spread_over_the_ids_without_overlap() -> None:
    ids = np.arange(100, dtype=np.int32)
    w = spread_windows(ids, 10, 3)
    assert w.tolist() == [list(range(0, 10)), list(range(40, 50)), list(range(90, 100))]
    assert spread_windows(ids, 30, 8).shape == (3, 30)  # as many as fit
    with pytest.raises(ValueError, match="no window"):
        spread_windows(ids[:5], 10, 1)
