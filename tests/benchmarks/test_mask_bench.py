"""What llguidance's token mask costs per generated token (pytest-benchmark; the normal test
run only checks it runs): a JSON-schema reply fed token by token, each step computing the
mask and applying it to a vocabulary's logits as ``MaskSampler`` does.

Vocabularies: the tiny fixture's own and, where ``BMOE_VOCAB_DIR`` holds them, llama.cpp's
own real vocabulary files (``models/ggml-vocab-gemma-4.gguf``: 262,144 tokens, Gemma's;
``ggml-vocab-qwen2.gguf``: 151,936, Qwen2's and Qwen3's), all read through llama.cpp as
``GuidanceMask`` reads them; and a synthetic 262,144-token byte-level one (words, sub-words,
digits and JSON punctuation, each with and without a leading blank) built here. The real
files ship in llama-cpp-python's source archive (docs/benchmarks.md says how to get them).
Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

llguidance = pytest.importorskip("llguidance")

from bmoe.adapters.llama.guidance import allowed_ids  # noqa: E402 - after the skip
from bmoe.adapters.llama.token_mask import TOKEN_DATA, mask_candidates  # noqa: E402

N_VOCAB = 262_144
SCHEMA = {
    "type": "object",
    "properties": {
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "day": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "kind": {"enum": ["alpha", "beta"]},
        "items": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 24}, "count": {"type": "integer"}},
                "required": ["name", "count"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["quantity", "day", "kind", "items"],
    "additionalProperties": False,
}
REPLY = {
    "quantity": 12,
    "day": "2026-12-03",
    "kind": "beta",
    "items": [{"name": "the blue pencils", "count": 3}, {"name": "an eraser", "count": 1}],
}


class _SyntheticTokenizer:
    eos_token_id = N_VOCAB - 1
    bos_token_id = None

    def __init__(self) -> None:
        rng = random.Random(0)
        letters = "etaoinshrdlcumwfgypbvkjxqz"
        seen = {bytes([b]) for b in range(256)}
        tokens = [bytes([b]) for b in range(256)]
        pieces = ['", "', '": ', '{"', '"}', "[{", "}]", "},", ", ", '":', '"', "-", ":"]
        for piece in pieces + [str(n) for n in range(1000)]:
            if piece.encode() not in seen:
                seen.add(piece.encode())
                tokens.append(piece.encode())
        while len(tokens) < N_VOCAB - 1:
            word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
            for text in (word, " " + word, word.capitalize(), " " + word.capitalize()):
                if text.encode() not in seen and len(tokens) < N_VOCAB - 1:
                    seen.add(text.encode())
                    tokens.append(text.encode())
        self.tokens = [*tokens, b"<eos>"]
        self.special_token_ids = [N_VOCAB - 1]
        self._ids = {t: i for i, t in enumerate(tokens)}

    def __call__(self, text: bytes | str) -> list[int]:
        """Longest match first (the reply's tokens; BPE's exact split does not matter here)."""
        data = text.encode() if isinstance(text, str) else text
        out, at = [], 0
        while at < len(data):
            n = next(n for n in range(min(11, len(data) - at), 0, -1) if data[at : at + n] in self._ids)
            out.append(self._ids[data[at : at + n]])
            at += n
        return out


def _apply(words: np.ndarray, view: np.ndarray) -> None:
    """What ``GuidanceMask.allowed`` and ``MaskSampler`` do to a step's candidates."""
    mask_candidates(view, allowed_ids(words, view.size))


def _step_through(tokenizer: Any, n_vocab: int) -> Callable[[], int]:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    )
    tokens = tokenizer.tokenize_str(json.dumps(REPLY))
    words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
    view = np.zeros(n_vocab, dtype=TOKEN_DATA)
    view["id"] = np.arange(n_vocab)

    def run() -> int:
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        for token in tokens:
            matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
            _apply(words, view)
            assert matcher.consume_token(token), matcher.get_error()
        return len(tokens)

    return run


def test_mask_per_token_on_a_262k_vocabulary(benchmark: Any) -> None:
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_SyntheticTokenizer()))
    run = _step_through(tokenizer, N_VOCAB)
    n = benchmark(run)
    benchmark.extra_info["tokens"] = n


def _vocab_files() -> list[str]:
    folder = os.environ.get("BMOE_VOCAB_DIR")
    names = ["ggml-vocab-gemma-4.gguf", "ggml-vocab-qwen2.gguf"]
    return [str(Path(folder) / n) for n in names if folder and (Path(folder) / n).exists()] or ["(none)"]


def _through_llama_cpp(benchmark: Any, path: Path) -> None:
    from bmoe.adapters.llama import guidance
    from bmoe.adapters.llama.model import LlamaModel, ModelParams

    with LlamaModel(path, ModelParams(vocab_only=True)) as model:
        t0 = time.perf_counter()
        vocab = guidance._vocabulary(model)
        benchmark.extra_info["vocabulary_build_s"] = time.perf_counter() - t0
        run = _step_through(vocab.tokenizer, vocab.n_vocab)
        benchmark.extra_info["tokens"] = benchmark(run)
        benchmark.extra_info["n_vocab"] = vocab.n_vocab


def test_mask_per_token_on_the_tiny_fixture(benchmark: Any) -> None:
    from bmoe.testing.fixtures import fixture_path

    _through_llama_cpp(benchmark, fixture_path("qwen3moe"))


@pytest.mark.parametrize("path", _vocab_files(), ids=lambda p: Path(p).name)
def test_mask_per_token_on_llama_cpps_real_vocabularies(benchmark: Any, path: str) -> None:
    if path == "(none)":
        pytest.skip("BMOE_VOCAB_DIR does not hold llama.cpp's ggml-vocab-*.gguf files")
    _through_llama_cpp(benchmark, Path(path))
