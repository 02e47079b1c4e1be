"""``--ppl`` reports the figure llama.cpp's perplexity tool would compute from stock
llama-cpp-python's logits, streamed equal to resident; ``--n-expert-used`` runs a MoE model
with another top-k, as stock llama.cpp does with the same metadata override."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.decide.log_softmax import log_softmax
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.perplexity import PplAccumulator, plan_windows
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ConfigError
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.oracle import stock_greedy

TinyModel = Callable[[str], Path]
N_CTX = 64
PARAMS = ContextParams(n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
TEXT = " ".join(["the quick brown fox jumps over a lazy dog while seven tired cats sleep"] * 40)


def stock_ppl(path: Path, text: str) -> float:
    """The tool's figure computed from stock llama-cpp-python's logits, window by window."""
    stock = llama_cpp.Llama(
        model_path=str(path), n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_threads=2,
        flash_attn=False, logits_all=True, verbose=False,
    )  # fmt: skip
    try:
        tokens = stock.tokenize(text.encode(), add_bos=True, special=True)
        acc = PplAccumulator()
        for w in plan_windows(len(tokens), N_CTX):
            chunk = tokens[w.start : w.start + w.n_ctx]
            stock.reset()
            stock.eval(chunk)
            rows = np.array(stock.scores[w.first : w.n_ctx - 1], dtype=np.float32)
            acc.add(float(x) for x in log_softmax(rows)[np.arange(w.n_scored), chunk[w.first + 1 :]])
        return acc.ppl
    finally:
        stock.close()


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss"])
def test_perplexity_equals_the_tools_figure_from_stock_logits(name: str, tiny_model_path: TinyModel) -> None:
    path = tiny_model_path(name)
    with Session.open(SessionConfig(model_path=path, context=PARAMS)) as s:
        ours = s.perplexity_windows(TEXT)
    with Session.open(
        SessionConfig(model_path=path, context=PARAMS, stream=StreamConfig(enabled=True, cache_mb=0))
    ) as s:
        streamed = s.perplexity_windows(TEXT)
    assert ours.count == streamed.count > 0
    assert streamed.ppl == ours.ppl  # bit for bit: the same logits
    # stock computes every row, bmoe only the scored ones: the last bits may differ
    assert ours.ppl == pytest.approx(stock_ppl(path, TEXT), rel=1e-5)


def test_the_cli_prints_the_tools_lines(tiny_model_path: TinyModel, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe.cli", "-m", str(tiny_model_path("qwen3moe")), "--ppl", str(text),
         "-c", str(N_CTX), "--moe-stream"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("[1]") and lines[0].endswith(",")
    assert lines[-1].startswith("Final estimate: PPL = ") and " +/- " in lines[-1]


def test_too_short_a_text_is_refused(tiny_model_path: TinyModel) -> None:
    config = SessionConfig(model_path=tiny_model_path("qwen3moe"), context=PARAMS)
    with Session.open(config) as s, pytest.raises(ConfigError, match="needs at least 128 tokens"):
        s.perplexity_windows("too short")


def test_n_expert_used_runs_as_stock_llama_cpp_with_the_same_override(tiny_model_path: TinyModel) -> None:
    path = tiny_model_path("qwen3moe")
    prompt, n = "The quick brown fox", 8
    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
    runs = {}
    for k, stream in [(None, False), (1, False), (1, True)]:
        cfg = SessionConfig(
            model_path=path, context=params, n_expert_used=k, stream=StreamConfig(enabled=stream, cache_mb=0)
        )
        with Session.open(cfg) as s:
            assert s.n_expert_used == (k or 2)
            runs[(k, stream)] = (s.generate(GenerateRequest(prompt, n_predict=n)).tokens, s.last_logits())
    assert runs[(1, False)][0] == runs[(1, True)][0]  # streamed equals resident at the new top-k
    assert np.array_equal(runs[(1, False)][1], runs[(1, True)][1])
    assert not np.array_equal(runs[(None, False)][1], runs[(1, False)][1])  # top-1 is another model
    stock = llama_cpp.Llama(
        model_path=str(path), n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn=False,
        verbose=False, kv_overrides={"qwen3moe.expert_used_count": 1},
    )  # fmt: skip
    try:
        tokens = []
        for token in stock.generate(stock.tokenize(prompt.encode(), add_bos=False, special=True), temp=0.0):
            tokens.append(token)
            if len(tokens) == n:
                break
    finally:
        stock.close()
    assert list(runs[(1, False)][0]) == tokens
    assert list(runs[(None, False)][0]) == stock_greedy(path, prompt, n)[0]


@pytest.mark.parametrize("k", [0, 9])
def test_n_expert_used_outside_the_models_experts_is_refused(k: int, tiny_model_path: TinyModel) -> None:
    with pytest.raises(ConfigError, match="between 1 and the model's 8 experts"):
        Session.open(SessionConfig(model_path=tiny_model_path("qwen3moe"), n_expert_used=k))
