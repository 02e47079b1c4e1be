"""The C eval callback records the expert ids each MoE layer's graph really uses.

Runs on the generated tiny MoE fixtures. Three facts pin it:
- observing changes nothing: tokens and logits bit-identical with and without the callback;
- what it records is the router's top-k (checked against the router probabilities it also
  captures, token by token, over a multi-token prefill: a wrong stride would read other ids);
- the ids it sees are the ids the graph uses: overwriting them in place changes the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.cext.route_recorder import RouteRecorder
from bmoe.domain.moe_arch import prunes_last_ffn

MOE_FIXTURES = ["qwen3moe", "qwen35moe", "gpt-oss", "qwen3moe-odd"]
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
N_DECODE = 6
PARAMS = ContextParams(n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2)


def greedy(model: LlamaModel, recorder: RouteRecorder | None) -> tuple[list[int], list[np.ndarray]]:
    """Prefill PROMPT, then greedy-decode N_DECODE tokens; return tokens and every logit row."""
    with LlamaContext(model, PARAMS, eval_callback=recorder) as ctx:
        prompt = model.tokenize(PROMPT)
        ctx.decode(prompt, 0)
        rows = [ctx.logits()]
        tokens: list[int] = []
        for i in range(N_DECODE):
            token = int(np.argmax(rows[-1]))
            tokens.append(token)
            ctx.decode([token], len(prompt) + i)
            rows.append(ctx.logits())
    return tokens, rows


@pytest.fixture(params=MOE_FIXTURES)
def model(request: pytest.FixtureRequest, tiny_model_path: Callable[[str], Path]) -> Iterator[LlamaModel]:
    with LlamaModel(tiny_model_path(request.param)) as m:
        yield m


def test_observing_the_routing_changes_no_bit(model: LlamaModel) -> None:
    plain_tokens, plain_rows = greedy(model, None)
    recorder = RouteRecorder(capture_probs=True)
    seen_tokens, seen_rows = greedy(model, recorder)
    assert seen_tokens == plain_tokens
    for a, b in zip(plain_rows, seen_rows, strict=True):
        assert np.array_equal(a, b)
    assert len(recorder) > 0


def test_one_record_per_moe_layer_per_ubatch_in_graph_order(model: LlamaModel) -> None:
    recorder = RouteRecorder()
    greedy(model, recorder)
    n_layer = model.n_layer
    n_prompt = len(model.tokenize(PROMPT))
    records = recorder.records()
    assert not recorder.overflowed
    assert len(records) == n_layer * (1 + N_DECODE) == recorder.n_topk_seen
    for ubatch in range(1 + N_DECODE):
        chunk = records[ubatch * n_layer : (ubatch + 1) * n_layer]
        assert [layer for layer, _, _ in chunk] == list(range(n_layer))
        for layer, ids, probs in chunk:
            assert probs is None
            assert ids.shape[1] == model.n_expert_used
            # qwen3moe's last layer runs only the rows whose logits are asked for (one);
            # qwen35moe and gpt-oss prune rows after the last layer instead: the registry's
            # flag, which the plan's prefill counts by, says which
            pruned = layer == n_layer - 1 and prunes_last_ffn(model.arch)
            expected_rows = n_prompt if ubatch == 0 and not pruned else 1
            assert ids.shape[0] == expected_rows
            assert ((ids >= 0) & (ids < model.n_expert)).all()
            assert all(len(set(row)) == len(row) for row in ids.tolist())


def test_recorded_ids_are_the_routers_top_k_token_by_token(model: LlamaModel) -> None:
    recorder = RouteRecorder(capture_probs=True)
    greedy(model, recorder)
    records = recorder.records()
    assert len(records) > 0
    multi_token = 0
    for _, ids, probs in records:
        assert probs is not None and probs.shape == (ids.shape[0], model.n_expert)
        top_k = np.argsort(-probs, axis=1, kind="stable")[:, : ids.shape[1]]
        assert np.array_equal(np.sort(ids, axis=1), np.sort(top_k, axis=1))
        multi_token += ids.shape[0] > 1
    assert multi_token > 0, "the prefill must exercise a multi-token (strided) gather"


def test_rewriting_the_ids_changes_what_the_graph_computes(model: LlamaModel) -> None:
    _, plain_rows = greedy(model, None)
    forced_rows = {}
    for expert in (0, 1):
        recorder = RouteRecorder()
        recorder.force_expert = expert
        _, forced_rows[expert] = greedy(model, recorder)
        assert not np.array_equal(forced_rows[expert][0], plain_rows[0])
    assert not np.array_equal(forced_rows[0][0], forced_rows[1][0])


def test_the_recorder_clears_and_validates() -> None:
    recorder = RouteRecorder()
    assert recorder.force_expert == -1
    with pytest.raises(ValueError, match="force_expert must be -1 or an expert id"):
        recorder.force_expert = -5
    recorder.clear()
    assert len(recorder) == 0 and recorder.records() == [] and not recorder.overflowed
    assert recorder.callback_address != 0 and recorder.user_data_address != 0
