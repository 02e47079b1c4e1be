"""Reading a model's output head from its GGUF for the decide probe's lens (no model loaded):
the head rows of any type, dequantized; a tied head; the norm's epsilon as stored; the
logit transforms llama.cpp applies."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bmoe.adapters.output_head import GgufOutputHead, logit_scale_factor
from bmoe.errors import ConfigError

N_EMBD, N_VOCAB = 64, 40


def write_gguf(
    path: Path,
    arch: str,
    *,
    head: gguf.GGMLQuantizationType | None,
    embd: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    floats: dict[str, float] | None = None,
    bias: bool = False,
) -> dict[str, np.ndarray]:
    """A GGUF holding only the tensors the lens reads; returns them as float32."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (floats or {}).items():
        writer.add_float32(key, value)
    made: dict[str, np.ndarray] = {}

    def add(name: str, value: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, value)
            made[name] = value
        else:
            packed = gguf.quants.quantize(value, qtype)
            writer.add_tensor(name, packed, raw_dtype=qtype)
            made[name] = gguf.quants.dequantize(packed, qtype)

    add("token_embd.weight", rng.normal(size=(N_VOCAB, N_EMBD)).astype(np.float32), embd)
    if head is not None:
        add("output.weight", rng.normal(size=(N_VOCAB, N_EMBD)).astype(np.float32), head)
    add("output_norm.weight", rng.normal(size=N_EMBD).astype(np.float32), gguf.GGMLQuantizationType.F32)
    if bias:
        add("output_norm.bias", rng.normal(size=N_EMBD).astype(np.float32), gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return made


@pytest.mark.parametrize(
    "qtype",
    [
        gguf.GGMLQuantizationType.F32,
        gguf.GGMLQuantizationType.F16,
        gguf.GGMLQuantizationType.Q8_0,
        gguf.GGMLQuantizationType.Q4_0,
    ],
    ids=lambda q: q.name,
)
def test_the_head_rows_of_the_choices_are_read_and_dequantized(
    tmp_path: Path, qtype: gguf.GGMLQuantizationType
) -> None:
    path = tmp_path / "m.gguf"
    eps = {"qwen3moe.attention.layer_norm_rms_epsilon": 1e-7}
    made = write_gguf(path, "qwen3moe", head=qtype, floats=eps)
    head = GgufOutputHead(path, "qwen3moe")
    try:
        assert head.head_name == "output.weight"
        assert np.array_equal(head.rows([7, 3, 7]), made["output.weight"][[7, 3, 7]])
        assert np.array_equal(head.output.norm_weight, made["output_norm.weight"])
        assert head.output.eps == pytest.approx(1e-7, rel=1e-6)  # as stored, not a 6-decimal text
        assert (head.output.norm_kind, head.output.logit_scale, head.output.softcap) == ("rms", 1.0, 0.0)
        with pytest.raises(ConfigError, match=r"row 40 is outside output.weight \(40 rows\)"):
            head.rows([40])
    finally:
        head.close()


def test_a_tied_head_is_the_embedding_table(tmp_path: Path) -> None:
    path = tmp_path / "tied.gguf"
    made = write_gguf(path, "qwen3moe", head=None, embd=gguf.GGMLQuantizationType.Q8_0)
    head = GgufOutputHead(path, "qwen3moe")
    try:
        assert head.head_name == "token_embd.weight"
        assert np.array_equal(head.rows([0, 39]), made["token_embd.weight"][[0, 39]])
    finally:
        head.close()


def test_the_logit_transforms_and_a_layer_norm_come_from_the_metadata(tmp_path: Path) -> None:
    granite = tmp_path / "granite.gguf"
    write_gguf(granite, "granitemoe", head=None, floats={"granitemoe.logit_scale": 8.0})
    gemma = tmp_path / "gemma.gguf"
    write_gguf(gemma, "gemma4", head=None, floats={"gemma4.final_logit_softcapping": 30.0})
    layer = tmp_path / "layer.gguf"
    made = write_gguf(layer, "gpt2", head=None, floats={"gpt2.attention.layer_norm_epsilon": 1e-5}, bias=True)
    files = [(granite, "granitemoe"), (gemma, "gemma4"), (layer, "gpt2")]
    heads = [GgufOutputHead(p, arch) for p, arch in files]
    try:
        assert heads[0].output.logit_scale == 1.0 / 8.0 and heads[0].output.softcap == 0.0
        assert heads[1].output.logit_scale == 1.0 and heads[1].output.softcap == 30.0
        assert heads[2].output.norm_kind == "layer" and heads[2].output.eps == pytest.approx(1e-5)
        assert heads[2].output.norm_bias is not None
        assert np.array_equal(heads[2].output.norm_bias, made["output_norm.bias"])
    finally:
        for head in heads:
            head.close()


def test_granite_divides_by_its_logit_scale_the_others_multiply() -> None:
    assert logit_scale_factor("granitemoe", 4.0) == 0.25
    assert logit_scale_factor("command-r", 0.0625) == 0.0625
    assert logit_scale_factor("qwen3moe", None) == 1.0


def test_a_model_without_an_output_norm_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"no output_norm\.weight or no output head"):
        GgufOutputHead(path, "qwen3moe")
