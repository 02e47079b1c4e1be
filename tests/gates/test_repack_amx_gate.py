"""On a CPU where llama.cpp tries another extra buffer type before ``CPU_REPACK`` (AMX on
Intel CPUs with AMX), bmoe's streaming cannot reproduce llama.cpp's load-time layout: the
streamed model keeps the file's layout, says so, and equals a resident ``--no-repack`` run
bit for bit (instead of crashing in a layout llama.cpp never chose, as it did before)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.adapters.llama.repack import CpuRepack
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

REPACK = CpuRepack.find()
pytestmark = pytest.mark.skipif(
    REPACK is None or not REPACK.ahead,
    reason="llama.cpp tries no other buffer type before CPU_REPACK on this CPU (test_repack_gates.py runs)",
)
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64)
REQUEST = GenerateRequest("The quick brown fox", n_predict=12)


def test_streamed_keeps_the_files_layout_and_equals_a_resident_no_repack_run(tmp_path: Path) -> None:
    shape = SyntheticShape(
        n_layer=3, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2, head_dim=64, quant="q4_0"
    )
    path = write_synthetic(tmp_path / "q4_0.gguf", shape, seed=3, progress=False)
    with Session.open(SessionConfig(model_path=path, context=PARAMS, repack=False)) as resident:
        tokens = resident.generate(REQUEST).tokens
        logits = resident.last_logits()
    config = SessionConfig(model_path=path, context=PARAMS, stream=StreamConfig(enabled=True, cache_mb=1))
    with Session.open(config) as streamed:
        assert streamed.streaming is not None
        assert streamed.generate(REQUEST).tokens == tokens
        assert np.array_equal(streamed.last_logits(), logits)
        layout = streamed.weight_layout
        assert not layout.repacked and "AMX" in layout.unreproduced and "AMX" in layout.summary()
