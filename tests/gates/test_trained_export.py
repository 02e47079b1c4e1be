"""The trained-model tool's exporter and numpy reference forward agree with llama.cpp (no torch
needed): a tiny randomly initialised model of the same ``qwen3moe`` layout, exported as GGUF,
gives llama.cpp's logits within the tool's tolerance of the numpy forward pass, routes every
token to the experts the reference routes it to, and holds the tensors a real ``qwen3moe``
file holds. With torch installed, the torch model equals the reference too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.bench.text import TEXT
from bmoe.bench.trained.check import DEFAULT_TOLERANCE, compare, llama_logits
from bmoe.bench.trained.export import write_gguf
from bmoe.bench.trained.init import random_weights
from bmoe.bench.trained.layout import TrainedDims, expected_shapes, layer_names
from bmoe.bench.trained.main import QUANTIZED_MAX_DIFF, QUANTIZED_MEAN_DIFF
from bmoe.bench.trained.padded import write_padded_gguf
from bmoe.bench.trained.reference import forward
from bmoe.bench.trained.tokens import tokenize
from bmoe.cext.route_recorder import RouteRecorder

DIMS = TrainedDims(
    n_layer=3, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2, n_ff_exp=32
)
SEED = 3
WINDOW = 48


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return random_weights(DIMS, SEED)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory, weights: dict[str, np.ndarray]) -> Path:
    return write_gguf(tmp_path_factory.mktemp("trained") / "tiny.gguf", DIMS, weights, meta={"seed": SEED})


@pytest.fixture(scope="module")
def windows() -> list[list[int]]:
    ids = tokenize(TEXT).tolist()
    return [ids[:WINDOW], ids[200 : 200 + WINDOW - 7]]


def test_the_file_holds_a_qwen3moe_layout(model_path: Path) -> None:
    reader = GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    shapes = expected_shapes(DIMS)
    assert list(tensors) == list(shapes)
    for name, shape in shapes.items():
        assert tuple(int(n) for n in reversed(tensors[name].shape)) == shape, name
        assert tensors[name].tensor_type == GGMLQuantizationType.F32, name
    for il in range(DIMS.n_layer):
        n = layer_names(il)
        for exps in (n.gate_exps, n.up_exps, n.down_exps):
            assert exps.endswith("_exps.weight") and len(tensors[exps].shape) == 3
        assert n.router == f"blk.{il}.ffn_gate_inp.weight"
    arch = reader.get_field("general.architecture")
    assert arch is not None and arch.contents() == "qwen3moe"
    seed = reader.get_field("bmoe.trained.seed")
    assert seed is not None and seed.contents() == SEED
    with LlamaModel(model_path) as model:
        assert (model.arch, model.n_layer, model.n_expert, model.n_expert_used) == ("qwen3moe", 3, 8, 2)
        assert model.n_vocab == DIMS.n_vocab
        text = TEXT[:300]
        assert model.tokenize(text, add_special=False, parse_special=False) == tokenize(text).tolist()


def test_llama_cpp_logits_equal_the_numpy_forward_pass(
    model_path: Path, weights: dict[str, np.ndarray], windows: list[list[int]]
) -> None:
    reference = [forward(DIMS, weights, w).logits for w in windows]
    check = compare(reference, llama_logits(model_path, windows))
    assert check.ok, check.text()
    assert check.argmax_agreement == 1.0
    assert check.n_tokens == sum(len(w) for w in windows)
    assert np.abs(reference[0]).max() > 100 * DEFAULT_TOLERANCE  # the logits are not all ~0


def test_llama_cpp_routes_every_token_as_the_reference_does(
    model_path: Path, weights: dict[str, np.ndarray], windows: list[list[int]]
) -> None:
    window = windows[0]
    recorder = RouteRecorder()
    params = ContextParams(n_ctx=256, n_batch=WINDOW, n_ubatch=WINDOW, flash_attn="off")
    with LlamaModel(model_path) as model, LlamaContext(model, params, eval_callback=recorder) as ctx:
        ctx.decode(window, 0, logits="all")
    records = recorder.records()
    assert [layer for layer, _, _ in records] == list(range(DIMS.n_layer))
    expected = forward(DIMS, weights, window).routed
    for layer, ids, _ in records:
        assert np.array_equal(np.sort(ids, axis=1), np.sort(expected[:, layer], axis=1)), layer
    assert len({tuple(sorted(row)) for row in expected[:, 0].tolist()}) > 4  # routing varies


def test_a_wrong_weight_fails_the_check(
    tmp_path: Path, weights: dict[str, np.ndarray], windows: list[list[int]]
) -> None:
    wrong = dict(weights)
    name = layer_names(1).down_exps
    wrong[name] = np.ascontiguousarray(weights[name][::-1])  # experts in the wrong order
    path = write_gguf(tmp_path / "wrong.gguf", DIMS, wrong)
    reference = [forward(DIMS, weights, w).logits for w in windows]
    assert not compare(reference, llama_logits(path, windows)).ok


def test_the_exporter_refuses_a_misshapen_tensor(tmp_path: Path, weights: dict[str, np.ndarray]) -> None:
    bad = dict(weights)
    bad[layer_names(0).router] = np.zeros((DIMS.n_embd, DIMS.n_expert), dtype=np.float32)
    with pytest.raises(ValueError, match="ffn_gate_inp"):
        write_gguf(tmp_path / "bad.gguf", DIMS, bad)
    assert not (tmp_path / "bad.gguf").exists()


def test_the_numpy_parts_never_import_torch() -> None:
    modules = [
        "layout",
        "init",
        "export",
        "reference",
        "check",
        "figures",
        "table",
        "corpus",
        "tokens",
        "padded",
    ]
    modules.append("main")  # imports the torch modules only when it runs
    code = "; ".join(f"import bmoe.bench.trained.{m}" for m in modules)
    code += "; import sys; assert 'torch' not in sys.modules, 'torch was imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


PADDED = 4 * DIMS.n_ff_exp


def test_padding_the_experts_with_zeros_changes_no_logit(
    tmp_path: Path, weights: dict[str, np.ndarray], windows: list[list[int]]
) -> None:
    """The bench-scale export: Q4_0 experts padded to 4x their width compute, bit for bit,
    what the same Q4_0 experts at their trained width compute."""
    padded, _ = write_padded_gguf(tmp_path / "padded.gguf", DIMS, weights, PADDED)
    narrow, _ = write_padded_gguf(tmp_path / "narrow.gguf", DIMS, weights, DIMS.n_ff_exp)
    wide, slim = llama_logits(padded, windows), llama_logits(narrow, windows)
    for a, b in zip(wide, slim, strict=True):
        assert np.array_equal(a, b)
    reader = GGUFReader(padded)
    tensors = {t.name: t for t in reader.tensors}
    for il in range(DIMS.n_layer):
        n = layer_names(il)
        for name in (n.gate_exps, n.up_exps, n.down_exps):
            assert tensors[name].tensor_type == GGMLQuantizationType.Q4_0
        assert tensors[n.router].tensor_type == GGMLQuantizationType.F32
        assert list(tensors[n.gate_exps].shape) == [DIMS.n_embd, PADDED, DIMS.n_expert]  # ggml order
        assert list(tensors[n.down_exps].shape) == [PADDED, DIMS.n_embd, DIMS.n_expert]
    assert padded.stat().st_size > narrow.stat().st_size


def test_the_padded_file_computes_the_reference_on_its_dequantized_experts(
    tmp_path: Path, weights: dict[str, np.ndarray], windows: list[list[int]]
) -> None:
    path, computed = write_padded_gguf(tmp_path / "padded.gguf", DIMS, weights, PADDED)
    reference = [forward(DIMS, computed, w).logits for w in windows]
    check = compare(
        reference, llama_logits(path, windows), QUANTIZED_MAX_DIFF, mean_tolerance=QUANTIZED_MEAN_DIFF
    )
    assert check.ok, check.text()
    assert check.argmax_agreement > 0.9
    unquantized = [forward(DIMS, weights, w).logits for w in windows]
    assert not np.array_equal(reference[0], unquantized[0])  # Q4_0 moved the experts' values


def test_the_torch_model_equals_the_numpy_forward_pass(
    weights: dict[str, np.ndarray], windows: list[list[int]]
) -> None:
    torch = pytest.importorskip("torch")
    from bmoe.bench.trained import torch_model as tm

    tokens = torch.tensor([windows[0], windows[0][::-1]])
    with torch.no_grad():
        out = tm.forward(DIMS, tm.to_params(weights), tokens, trace=True)
    for row, window in enumerate((windows[0], windows[0][::-1])):
        ref = forward(DIMS, weights, window)
        assert np.abs(out.logits[row].numpy() - ref.logits).max() < 1e-4
        assert np.array_equal(np.sort(out.routed[row].numpy(), -1), np.sort(ref.routed, -1))
        assert np.abs(out.router_inputs[row].numpy() - ref.router_inputs).max() < 1e-4
