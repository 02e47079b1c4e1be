"""The decide probe (``--decide-probe``) on the tiny models: it observes and changes nothing
(decisions, a chat after them and the streamer's work are bit for bit those of a session
without it, resident and streamed through an evicting cache); its lens at the last layer is
the model's own answer; its routing counts are the ids and weights the graph used; the CLI
writes one line per decision."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from bmoe.adapters.decide_probe import LlamaDecideProbe
from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.adapters.protocol import DecideDone
from bmoe.cext.route_recorder import RouteRecorder
from bmoe.client import SessionClient
from bmoe.domain.decide import DecideConfig, DecideRequest, DecideResult, log_softmax
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures import ARCH_FIXTURES

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=32, n_threads=2)  # prompts span ubatches
TASK = "You control a phone. Task: turn on Wi-Fi. "
DECISIONS = [
    DecideRequest(prefix=TASK, suffix="Screen: Home. Options: A) Settings B) Camera.", choices=("A", "B")),
    DecideRequest(
        prefix=TASK, suffix="Screen: Settings. Options: A) Network B) Display C) Sound.", choices="ABC"
    ),
    DecideRequest(prefix=TASK, suffix="Done? A) yes B) no", choices=("A", "B"), reuse_prefix=False),
]
# The lens at the last layer against decide's logp renormalised over the choices: the same
# float32 state, norm and head rows, summed in another order (llama.cpp: float32 by ggml,
# the lens: float64). Observed under 1e-7 on every fixture (float32 heads).
LENS_ATOL = 1e-5


def read_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def renormalised(logp: tuple[float, ...]) -> np.ndarray:
    return log_softmax(np.asarray(logp))


def session_config(path: Path, probe: Path | None, stream: StreamConfig | None = None) -> SessionConfig:
    return SessionConfig(
        model_path=path,
        context=PARAMS,
        chat=True,
        think=False,
        n_predict=6,
        decide=DecideConfig(enabled=True, prefix_cache="on", probe=probe),  # the same pieces either way
        stream=stream or StreamConfig(),
    )


def run(config: SessionConfig) -> tuple[list[DecideResult], tuple[int, ...], np.ndarray, object]:
    """The decisions, then a chat turn: its tokens and last logits, and the stream counters."""
    with Session.open(config) as session:
        results = [session.decide(d) for d in DECISIONS]
        chat = session.generate(GenerateRequest("And now?"))
        counters = session.streaming.counters() if session.streaming is not None else None
        return results, chat.tokens, session.last_logits(), counters


@pytest.mark.parametrize("name", ["qwen3moe", "qwen35moe"])
@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed-evicting"])
def test_the_probe_changes_no_decision_no_chat_and_no_streaming_work(
    name: str, streamed: bool, tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    path = tiny_model_path(name)
    stream = StreamConfig(enabled=True, cache_mb=1) if streamed else None
    probe_file = tmp_path / "probe.jsonl"
    plain = run(session_config(path, None, stream))
    probed = run(session_config(path, probe_file, stream))
    expected, got = plain[0], probed[0]
    assert [(r.best, r.choice_logp, r.n_reused, r.n_prefilled) for r in got] == [
        (r.best, r.choice_logp, r.n_reused, r.n_prefilled) for r in expected
    ]
    assert any(r.n_reused > 0 for r in got)  # a kept prefix was restored under the probe too
    assert probed[1] == plain[1] and np.array_equal(probed[2], plain[2])  # the chat after
    if streamed:
        before, after = plain[3], probed[3]
        assert before is not None and after is not None
        assert before.evictions > 0  # the cache evicts: streaming worked for its reads
        for field in ("requests", "hits", "misses", "evictions", "rereads", "bytes_read"):
            assert getattr(after, field) == getattr(before, field), field
    lines = read_lines(probe_file)
    assert [line["seq"] for line in lines] == [0, 1, 2]
    assert [line["logp"] for line in lines] == [list(r.choice_logp) for r in got]


@pytest.mark.parametrize("name", sorted(ARCH_FIXTURES.values()))
def test_the_lens_at_the_last_layer_is_the_models_own_answer(
    name: str, tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    probe_file = tmp_path / "probe.jsonl"
    with Session.open(session_config(tiny_model_path(name), probe_file)) as session:
        results = [session.decide(d) for d in DECISIONS]
        n_layer, n_expert, k = session.model.n_layer, session.n_expert, session.n_expert_used
    lines = read_lines(probe_file)
    assert len(lines) == len(results)
    for line, result, request in zip(lines, results, DECISIONS, strict=True):
        lens = line["lens"]
        assert isinstance(lens, list) and len(lens) == n_layer and all(row is not None for row in lens)
        assert np.allclose(lens[-1], renormalised(result.choice_logp), atol=LENS_ATOL, rtol=0)
        assert line["choices"] == list(request.choices) and line["best"] == result.best
        assert (line["n_tokens"], line["n_prefilled"]) == (result.n_tokens, result.n_prefilled)
        nu, cnt = line["nu"], np.asarray(line["cnt"])
        assert nu == k and cnt.shape == (n_layer, n_expert)
        # each MoE layer routed every prefilled token, or only the tokens with logits (a last
        # layer llama.cpp cuts to its output rows: the last token of each prefill piece, and a
        # decision that stored a prefix state prefilled two); a dense layer routed none
        n_pieces = 2 if result.n_stored else 1
        assert set(cnt.sum(axis=1)) <= {0, nu * result.n_prefilled, nu * n_pieces}
        assert cnt[1:].sum(axis=1).max() == nu * result.n_prefilled  # the first may be dense


def probe_and_recorder(
    model: LlamaModel, tmp_path: Path, *, probe: bool
) -> tuple[list[tuple[int, np.ndarray, np.ndarray | None]], np.ndarray, LlamaDecideProbe | None]:
    """Decode a prompt of several ubatches with a route recorder (capturing the router's
    probabilities), wrapped by the probe or not: the records, the logits, the probe."""
    recorder = RouteRecorder(capture_probs=True)
    wrapped = LlamaDecideProbe.open(model, PARAMS.n_ubatch, tmp_path / "p.jsonl", recorder) if probe else None
    with LlamaContext(model, PARAMS, eval_callback=wrapped.callback if wrapped else recorder) as ctx:
        tokens = model.tokenize_prompt("The probe reads the graph; it must not change it. " * 3)
        assert len(tokens) > 2 * PARAMS.n_ubatch
        if wrapped is not None:
            wrapped.begin()
        ctx.decode(tokens, 0)
        if wrapped is not None:
            wrapped.end()
        return recorder.records(), ctx.logits(-1), wrapped


def test_chained_to_a_route_recorder_the_probe_counts_the_ids_and_weights_the_graph_used(
    tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    with LlamaModel(tiny_model_path("qwen3moe")) as model:  # softmax router, top-k weights normalised
        alone, alone_logits, _ = probe_and_recorder(model, tmp_path, probe=False)
        records, logits, probe = probe_and_recorder(model, tmp_path, probe=True)
        assert probe is not None
        try:
            observed = probe.observation([5, 17, 42])
            n_embd = int(llama_cpp.llama_model_n_embd(model.ptr))
            last_layer_logits = probe.head.output.logits(observed.states[-1], observed.rows)
        finally:
            probe.close()
    # the recorder inside the probe saw and recorded exactly what it does alone
    assert len(records) == len(alone) > 0
    for (layer, ids, probs), (layer0, ids0, probs0) in zip(records, alone, strict=True):
        assert layer == layer0 and np.array_equal(ids, ids0)
        assert probs is not None and probs0 is not None and np.array_equal(probs, probs0)
    assert np.array_equal(logits, alone_logits)
    # the probe's counters are the recorder's ids, weighted by the normalised probabilities
    cnt = np.zeros_like(observed.cnt)
    wsum = np.zeros_like(observed.wsum)
    for layer, ids, probs in records:
        assert probs is not None
        chosen = np.take_along_axis(probs, ids.astype(np.int64), axis=1)
        weights = chosen / chosen.sum(axis=1, keepdims=True)
        np.add.at(cnt[layer], ids.reshape(-1), 1)
        np.add.at(wsum[layer], ids.reshape(-1), weights.reshape(-1))
    assert np.array_equal(observed.cnt, cnt) and observed.nu == ids.shape[1]
    assert np.allclose(observed.wsum, wsum, rtol=1e-6, atol=1e-6)
    # and its last layer's state, through the head, is the model's logits row
    assert observed.states.shape == (model_n_layer(records), n_embd) and observed.seen.all()
    assert np.allclose(last_layer_logits, logits[[5, 17, 42]], atol=LENS_ATOL, rtol=0)


def model_n_layer(records: list[tuple[int, np.ndarray, np.ndarray | None]]) -> int:
    return max(layer for layer, _, _ in records) + 1  # every qwen3moe layer is a MoE layer


def test_the_cli_appends_one_line_per_answered_decision(tiny_model_path: TinyModel, tmp_path: Path) -> None:
    probe_file = tmp_path / "probe.jsonl"
    probe_file.write_text('{"earlier":"line"}\n', encoding="utf-8")  # appended to, not replaced
    args = ["-m", str(tiny_model_path("qwen3moe")), "--chatml", "-c", "512"]
    args += ["--decide", "--decide-probe", str(probe_file)]
    with SessionClient(args) as client:
        first = client.decide(TASK, "Options: A) Network B) Display.", ["A", "B"], id="d1")
        refused = client.decide(TASK, "?", ["Yes", "Yes"], id="d2")
        second = client.decide(TASK, "Options: A) Wi-Fi B) Bluetooth.", ["A", "B"], id="d3")
    assert isinstance(first, DecideDone) and isinstance(second, DecideDone)
    assert not isinstance(refused, DecideDone)
    earlier, *lines = read_lines(probe_file)
    assert earlier == {"earlier": "line"} and len(lines) == 2
    for line, done in zip(lines, (first, second), strict=True):
        assert line["logp"] == list(done.choice_logp) and line["best"] == done.best
        assert line["n_tokens"] == done.n_tokens and line["n_prefilled"] == done.n_prefilled
    assert [line["seq"] for line in lines] == [0, 1]
