"""Asked to stream and unable to, a session runs resident, and its output equals a plain
resident run's bit for bit: its weights are placed as a plain resident run places them
(``CPU_REPACK`` where llama.cpp repacks, AMX only where it may be used), never left in the
file's layout where a plain resident run repacks.

The two places streaming can be found unavailable are forced here (before the streamer
exists, and while attaching it to the context), on a Q4_0 model whose weights have a
repacked form on x86 (AVX2) and ARM alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import attrs
import numpy as np
import pytest

from bmoe.adapters.expert_streaming import ExpertStreaming, StreamingUnavailable
from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.machine import SAFE_AMX
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
SHAPE = SyntheticShape(n_layer=3, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2, head_dim=64)
REQUEST = GenerateRequest("The quick brown fox jumps over the lazy dog", n_predict=10)


@pytest.fixture(scope="module")
def q4_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fallback")
    return write_synthetic(root / "q4_0.gguf", attrs.evolve(SHAPE, quant="q4_0"), seed=5, progress=False)


def run(path: Path, *, stream: bool, repack: bool = True) -> tuple[tuple[int, ...], np.ndarray, Session]:
    config = SessionConfig(
        model_path=path,
        context=PARAMS,
        amx=SAFE_AMX,
        repack=repack,
        stream=StreamConfig(enabled=stream, cache_mb=1),
    )
    with Session.open(config) as s:
        tokens = s.generate(REQUEST).tokens
        return tokens, s.last_logits(), s


def unavailable(*_: object, **__: object) -> NoReturn:
    raise StreamingUnavailable("forced by the test")


@pytest.mark.parametrize("where", ["new_streamer", "attach"])
@pytest.mark.parametrize("repack", [True, False], ids=["repack", "no-repack"])
def test_a_resident_fallback_computes_what_a_plain_resident_run_computes(
    where: str, repack: bool, q4_0: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens, logits, plain = run(q4_0, stream=False, repack=repack)
    monkeypatch.setattr(ExpertStreaming, where, classmethod(unavailable))
    got_tokens, got_logits, fallback = run(q4_0, stream=True, repack=repack)
    assert fallback.streaming is None
    assert "moe-stream: forced by the test; running resident" in fallback.notes
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)
    summary = fallback.weight_layout.summary()
    if repack:
        assert plain.weight_layout.repacked, plain.weight_layout
        assert fallback.weight_layout.repacked and "file's layout" not in summary, summary
        assert set(fallback.weight_buffer_types) == set(plain.weight_buffer_types)
    else:
        assert summary == plain.weight_layout.summary() == "weights in the file's layout (--no-repack)"
