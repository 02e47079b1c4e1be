"""The tiny fixture models are real models to stock llama.cpp (the gates' reference).

Every fixture loads in stock ``llama_cpp.Llama`` and generates greedily, the
same tokens twice; the tokenizer, template and special tokens are what the
gates rely on; the split, odd and sliding-window fixtures have the property
they exist for; and building is deterministic.
"""

from __future__ import annotations

import hashlib
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFReader

from bmoe.testing.fixtures import (
    CHAT_TEMPLATE,
    FIXTURES,
    build_fixture,
    build_vocab,
    encode,
    fixture_files,
    fixture_path,
    get_spec,
    render_chat,
)
from bmoe.testing.fixtures.__main__ import main as fixtures_cli
from bmoe.tinymodel.tokenizer import SPECIAL_TOKENS

N_GEN = 8
PAGE = 4096
PRINTABLE = {chr(c) for c in range(0x20, 0x7F)} | {"\t", "\n"}
PROMPTS = (
    "Hello world",
    "The quick brown fox",
    render_chat([{"role": "user", "content": "What is two plus two?"}]),
)

LoadLlama = Callable[..., llama_cpp.Llama]
TinyModelPath = Callable[..., Path]


@pytest.fixture(scope="module")
def load_llama(tiny_model_path: TinyModelPath) -> Iterator[LoadLlama]:
    """``load_llama(name, **params)``: a stock ``Llama`` on a fixture, kept for the module."""
    loaded: dict[tuple[str, tuple[tuple[str, object], ...]], llama_cpp.Llama] = {}

    def load(name: str, **params: object) -> llama_cpp.Llama:
        key = (name, tuple(sorted(params.items())))
        if key not in loaded:
            settings: dict[str, Any] = {"n_ctx": 256, "n_threads": 2, "verbose": False, "seed": 0}
            settings.update(params)
            loaded[key] = llama_cpp.Llama(model_path=str(tiny_model_path(name)), **settings)
        return loaded[key]

    yield load
    for llm in loaded.values():
        llm.close()


def tokenize(llm: llama_cpp.Llama, text: str) -> list[int]:
    """llama.cpp's tokenization, special tokens parsed, no BOS."""
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))


def greedy(llm: llama_cpp.Llama, prompt: str, n: int = N_GEN) -> list[int]:
    """``n`` greedy tokens after ``prompt``, prefilled from an empty context."""
    llm.reset()
    out: list[int] = []
    for token in llm.generate(tokenize(llm, prompt), temp=0.0, top_k=1, reset=True):
        out.append(int(token))
        if len(out) == n:
            break
    return out


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    """The logits of the last decoded row, straight from llama.cpp."""
    pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).copy()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expert_slice_bytes(path: Path, tensor: str) -> int:
    """Bytes of one expert (``nb[2]``) of a 3-D expert tensor, read from the GGUF header."""
    info = next(t for t in GGUFReader(path).tensors if t.name == tensor)
    return int(info.n_bytes) // int(info.shape[-1])


# --- every fixture -----------------------------------------------------------


def test_fixture_loads_in_stock_llama_cpp_and_greedy_generation_repeats(
    load_llama: LoadLlama, fixture_name: str
) -> None:
    llm = load_llama(fixture_name)
    for prompt in PROMPTS:
        first = greedy(llm, prompt)
        assert len(first) == N_GEN
        assert greedy(llm, prompt) == first


def test_fixture_output_varies_across_tokens_and_prompts(load_llama: LoadLlama, fixture_name: str) -> None:
    llm = load_llama(fixture_name)
    generated = [greedy(llm, prompt) for prompt in PROMPTS]
    assert len({token for run in generated for token in run}) >= 6, generated
    assert len({tuple(run) for run in generated}) == len(PROMPTS)
    logits = last_logits(llm)
    assert np.isfinite(logits).all() and logits.std() > 0.1


def test_fixture_greedy_text_is_printable_and_never_a_special_token(
    load_llama: LoadLlama, fixture_name: str
) -> None:
    llm = load_llama(fixture_name)
    specials = set(build_vocab().special_ids)
    for prompt in PROMPTS:
        tokens = greedy(llm, prompt)
        assert not specials & set(tokens)
        assert set(llm.detokenize(tokens).decode("ascii")) <= PRINTABLE


def test_fixture_metadata_describes_its_spec(load_llama: LoadLlama, fixture_name: str) -> None:
    spec = get_spec(fixture_name)
    llm = load_llama(fixture_name)
    meta = llm.metadata
    assert meta["general.architecture"] == spec.arch
    assert meta["general.name"] == spec.name
    assert int(meta[f"{spec.arch}.expert_count"]) == spec.dims.n_expert
    assert int(meta[f"{spec.arch}.expert_used_count"]) == spec.dims.n_expert_used
    assert int(meta[f"{spec.arch}.embedding_length"]) == spec.dims.n_embd
    assert meta["tokenizer.chat_template"] == CHAT_TEMPLATE
    assert meta["tokenizer.ggml.add_bos_token"] == "false"
    assert llm.n_vocab() == build_vocab().size
    assert llama_cpp.llama_model_n_ctx_train(llm.model) == spec.dims.n_ctx_train


def test_building_a_fixture_twice_gives_identical_bytes(tmp_path: Path, fixture_name: str) -> None:
    build_fixture(fixture_name, tmp_path / "a", seed=3)
    build_fixture(fixture_name, tmp_path / "b", seed=3)
    first = fixture_files(fixture_name, tmp_path / "a")
    second = fixture_files(fixture_name, tmp_path / "b")
    assert [sha256(p) for p in first] == [sha256(p) for p in second]


def test_another_seed_gives_other_weights(tmp_path: Path) -> None:
    a = build_fixture("qwen3moe", tmp_path / "a", seed=0)
    b = build_fixture("qwen3moe", tmp_path / "b", seed=1)
    assert sha256(a) != sha256(b)


# --- tokenizer and template --------------------------------------------------


def test_special_tokens_are_single_ids_and_im_end_ends_a_turn(load_llama: LoadLlama) -> None:
    llm = load_llama("qwen3moe", vocab_only=True)
    vocab = build_vocab()
    for text, _ in SPECIAL_TOKENS:
        assert tokenize(llm, text) == [vocab.token_id(text)], text
    assert llm.token_eos() == vocab.token_id("<|im_end|>")
    assert llm.token_bos() == vocab.token_id("<|endoftext|>")
    llama_vocab = llama_cpp.llama_model_get_vocab(llm.model)
    assert llama_cpp.llama_vocab_is_eog(llama_vocab, vocab.token_id("<|im_end|>"))


def test_python_tokenizer_agrees_with_llama_cpp(load_llama: LoadLlama) -> None:
    llm = load_llama("qwen3moe", vocab_only=True)
    texts = [
        "Hello world",
        "The capital of France is Paris.\n\nWhat's 2024 + 3.14?",
        "  leading spaces and trailing   ",
        render_chat([{"role": "user", "content": "Hi"}], enable_thinking=False),
    ]
    for text in texts:
        assert tokenize(llm, text) == encode(text, parse_special=True), text
    for text in ("naïve café ☕", "<think>x</think> <|im_end|>", "a\r\n\r\nb\t\tc   \n"):
        ours = encode(text, parse_special=False)
        assert list(llm.tokenize(text.encode(), add_bos=False, special=False)) == ours, text


def test_a_bpe_merge_spans_a_prefix_suffix_join_in_llama_cpp(load_llama: LoadLlama) -> None:
    llm = load_llama("qwen3moe", vocab_only=True)
    joined = tokenize(llm, "Hello wor") + tokenize(llm, "ld")
    whole = tokenize(llm, "Hello world")
    assert joined != whole
    assert llm.detokenize(joined) == llm.detokenize(whole) == b"Hello world"


def test_llama_cpp_python_renders_the_template_like_render_chat(load_llama: LoadLlama) -> None:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = load_llama("qwen3moe", vocab_only=True)
    messages: list[Any] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"},
        {"role": "user", "content": "More"},
    ]
    template = llm.metadata["tokenizer.chat_template"]
    formatter = Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="")
    for thinking in (True, False):
        rendered = formatter(messages=messages, enable_thinking=thinking).prompt
        assert rendered == render_chat(messages, enable_thinking=thinking)


# --- the fixtures with a purpose ---------------------------------------------


def test_split_fixture_loads_from_its_first_shard_and_matches_qwen3moe(
    load_llama: LoadLlama, tiny_model_path: TinyModelPath
) -> None:
    first = tiny_model_path("qwen3moe-split")
    shards = fixture_files("qwen3moe-split", first.parent)
    assert [p.name for p in shards] == [f"qwen3moe-split-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    header = GGUFReader(first)
    assert int(header.fields["split.count"].contents()) == 3
    assert int(header.fields["split.no"].contents()) == 0
    n_tensors = len(GGUFReader(tiny_model_path("qwen3moe")).tensors)
    assert int(header.fields["split.tensors.count"].contents()) == n_tensors
    split, whole = load_llama("qwen3moe-split"), load_llama("qwen3moe")
    for prompt in PROMPTS:
        assert greedy(split, prompt) == greedy(whole, prompt)


def test_odd_fixture_expert_slices_are_not_page_multiples(tiny_model_path: TinyModelPath) -> None:
    odd = expert_slice_bytes(tiny_model_path("qwen3moe-odd"), "blk.0.ffn_up_exps.weight")
    assert odd == get_spec("qwen3moe-odd").dims.expert_slice_bytes
    assert odd % PAGE != 0
    assert expert_slice_bytes(tiny_model_path("qwen3moe"), "blk.0.ffn_up_exps.weight") % PAGE == 0


def test_swa_fixture_has_a_32_token_window_on_alternate_layers(load_llama: LoadLlama) -> None:
    spec = FIXTURES["gpt-oss"]
    assert spec.swa is not None
    llm = load_llama("gpt-oss", swa_full=False)
    assert int(llm.metadata["gpt-oss.attention.sliding_window"]) == 32
    assert llama_cpp.llama_model_n_swa(llm.model) == 32
    assert [spec.swa.is_swa(il) for il in range(spec.dims.n_layer)] == [True, False, True, False]
    prompt = " ".join(["the world of tiny models"] * 10)
    assert len(tokenize(llm, prompt)) > 2 * 32
    first = greedy(llm, prompt)
    assert len(first) == N_GEN and greedy(llm, prompt) == first


def test_swa_fixture_drops_cells_that_left_the_window_once_past_256_tokens(load_llama: LoadLlama) -> None:
    """llama.cpp pads the SWA cache to 256 cells: only a longer sequence overwrites (prunes) cells."""
    llm = load_llama("gpt-oss", n_ctx=512, swa_full=False, n_batch=64, n_ubatch=64)
    prompt = " ".join(["the world of tiny models"] * 40)
    assert len(tokenize(llm, prompt)) > 300
    assert len(greedy(llm, prompt)) == N_GEN
    memory = llama_cpp.llama_get_memory(llm.ctx)
    assert llama_cpp.llama_memory_seq_pos_min(memory, 0) > 0, "no cell ever left the sliding window"


def test_qwen35moe_is_hybrid_and_its_state_cannot_be_trimmed_to_a_prefix(
    load_llama: LoadLlama, tiny_model_path: TinyModelPath
) -> None:
    spec = FIXTURES["qwen35moe"]
    assert spec.recurrent is not None
    layers = [spec.recurrent.is_recurrent(il) for il in range(spec.dims.n_layer)]
    assert layers == [True, True, True, False]
    names = {t.name for t in GGUFReader(tiny_model_path("qwen35moe")).tensors}
    assert {"blk.0.ffn_gate_up_exps.weight", "blk.0.ffn_up_shexp.weight", "blk.0.ssm_conv1d.weight"} <= names
    assert "blk.3.attn_q.weight" in names and "blk.0.ffn_up_exps.weight" not in names
    llm = load_llama("qwen35moe")
    assert llama_cpp.llama_model_is_hybrid(llm.model)
    llm.reset()
    llm.eval(tokenize(llm, "Hello world and the rest"))
    memory = llama_cpp.llama_get_memory(llm.ctx)
    assert not llama_cpp.llama_memory_seq_rm(memory, 0, 3, -1)


# --- cache and command line --------------------------------------------------


def test_fixture_path_reuses_a_build_and_rebuilds_a_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BMOE_FIXTURE_DIR", str(tmp_path))
    first = fixture_path("qwen3moe-split", seed=5)
    assert first.is_relative_to(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert fixture_path("qwen3moe-split", seed=5) == first and first.stat().st_mtime_ns == stamp
    last = fixture_files("qwen3moe-split", first.parent)[-1]
    digest = sha256(last)
    last.unlink()
    assert fixture_path("qwen3moe-split", seed=5) == first
    assert sha256(last) == digest
    assert not [p for p in first.parent.parent.iterdir() if p.name.startswith(".")]


def test_concurrent_fixture_path_calls_publish_one_complete_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BMOE_FIXTURE_DIR", str(tmp_path))
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=3, mp_context=spawn) as pool:
        paths = list(pool.map(fixture_path, ["qwen3moe-odd"] * 3))
    assert len(set(paths)) == 1
    assert sha256(paths[0]) == sha256(build_fixture("qwen3moe-odd", tmp_path / "direct"))
    assert not [p for p in paths[0].parent.parent.iterdir() if p.name.startswith(".")]


def test_cli_writes_the_fixture_and_prints_its_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fixtures_cli(["--arch", "qwen3moe-split", "--out", str(tmp_path), "--seed", "2"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(p) for p in fixture_files("qwen3moe-split", tmp_path)]
    assert all(Path(p).is_file() for p in printed)
    assert fixtures_cli(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in FIXTURES)
