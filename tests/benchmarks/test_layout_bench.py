"""How long streaming's layout work takes on a real-sized vocabulary (pytest-benchmark; the
normal test run only checks it runs): a GGUF with a 262,144-token vocabulary (Gemma's size;
Qwen's is 151,936) and 200,000 merges, as real MoE files carry, and 48 layers of tensors.
The target (issue "real models"): at most 0.5 s of layout work added to a load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from bmoe.adapters.gguf_layout import read_layout

N_VOCAB = 262_144


@pytest.fixture(scope="module")
def big_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("layout") / "big-vocab.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_token_list([f"tok{i}".encode() for i in range(N_VOCAB)])
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types([1] * N_VOCAB)
    w.add_token_merges([f"a{i} b{i}" for i in range(200_000)])
    for layer in range(48):
        for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            w.add_tensor(f"blk.{layer}.{name}.weight", np.zeros((4, 8, 16), dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp"):
            w.add_tensor(f"blk.{layer}.{name}.weight", np.zeros((8, 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_read_layout_on_a_262k_vocabulary(benchmark: Any, big_vocab_model: Path) -> None:
    layout = benchmark(read_layout, big_vocab_model)
    assert len(layout.tensors) == 48 * 8
