"""Prefills longer than one ubatch: a streamed prefill equals the resident one bit for bit.

The other gates prefill short prompts in one ubatch. Here every MoE fixture (every
architecture of the expert registry among them) prefills prompts of several 16-token
ubatches (``-b 16``): one that ends inside a ubatch and one that ends exactly at a ubatch
boundary, and, with a 64-token batch split into 16-token ubatches by llama.cpp itself, one
that spans two batches. For the same batch and ubatch sizes, the streamed run must equal the
resident run in the generated tokens, the prefill's logits (the first token's), the final
logits and every row's log-probability (``perplexity()``: all output rows of every ubatch),
with the cache off, a 3-entry cache (evicts within each layer), and a cache of one and a
half layers (evicts across layers) with the whole-layer read-ahead in prefill on and off;
each with the fast path and the reference policy, whose counters and LRU order must agree.

A different ubatch size is not compared: llama.cpp's own results may differ in the low bits
between ubatch sizes (docs/streaming.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.streaming import StreamConfig, StreamCounters
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
UBATCH = 16
SHAPES = {
    "b16": ContextParams(n_ctx=256, n_batch=UBATCH, n_ubatch=UBATCH, n_threads=2),
    "b64-ub16": ContextParams(n_ctx=256, n_batch=64, n_ubatch=UBATCH, n_threads=2),
}
# prompt lengths in tokens (BOS included): inside the 4th ubatch, at the end of the 4th;
# with 64-token batches, a second batch after a full one
PROMPTS = {"58 tokens": 58, "64 tokens (ubatch boundary)": 64, "70 tokens (two batches)": 70}
N_PREDICT = 4
TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the green "
    "forest where nobody can find it again. Later that evening the fox comes back, sits by "
    "the river and watches the water flow past the old stone bridge while the sun goes down."
)


@attrs.frozen
class Outcome:
    tokens: tuple[int, ...]
    prefill_logits: npt.NDArray[np.float32]  # the prompt's last row: the first token's logits
    final_logits: npt.NDArray[np.float32]
    logp: tuple[float, ...]  # every row of a whole-prompt prefill (perplexity)
    n_prompt: int


@attrs.frozen
class Streamed:
    outcome: Outcome
    prefill: StreamCounters
    counters: StreamCounters
    resident: list[tuple[int, int]]
    n_moe_layers: int

    def served_every_ubatch(self, n_ubatches: int) -> bool:
        """The prefill's MoE layer calls: each MoE layer once per ubatch, except that an
        architecture whose graph drops the rows without output before the last layer (most;
        not gemma4) routes no token there but in the ubatch holding the prompt's last token,
        and a layer call that routes none is not a request."""
        most = n_ubatches * self.n_moe_layers
        return most - (n_ubatches - 1) <= self.prefill.requests <= most


@functools.cache
def prompt_of(path: Path, n_tokens: int) -> str:
    """A prefix of ``TEXT`` that tokenizes (BOS included, as the prompt is fed) to exactly
    ``n_tokens`` tokens for this fixture."""
    with Session.open(SessionConfig(model_path=path, context=SHAPES["b16"])) as s:
        for end in range(1, len(TEXT) + 1):
            text = TEXT[:end]
            if not text.endswith(" ") and len(s.model.tokenize_prompt(text)) == n_tokens:
                return text
    raise AssertionError(f"no prefix of the text is {n_tokens} tokens long")


def outcome(s: Session, text: str) -> Outcome:
    prefill: list[npt.NDArray[np.float32]] = []

    def on_progress(p: Progress) -> None:
        if p.step == 1:  # sampled from the prefill's logits, before the token is fed
            prefill.append(s.last_logits())

    result = s.generate(GenerateRequest(text, n_predict=N_PREDICT), on_progress=on_progress)
    final = s.last_logits()
    assert len(result.tokens) == N_PREDICT and len(prefill) == 1
    return Outcome(result.tokens, prefill[0], final, s.perplexity(text).logp, result.n_prompt)


@functools.cache
def resident(path: Path, shape: str, prompt: str) -> Outcome:
    with Session.open(SessionConfig(model_path=path, context=SHAPES[shape])) as s:
        return outcome(s, prompt_of(path, PROMPTS[prompt]))


def streamed(path: Path, shape: str, prompt: str, *, entries: str, policy: str, ahead: bool) -> Streamed:
    """``entries``: ``"off"`` (cache off), ``"3"`` or ``"1.5 layers"`` (n_expert * 3 / 2)."""
    stream = StreamConfig(enabled=True, cache_mb=0, policy=policy, prefill_ahead=ahead)
    with Session.open(SessionConfig(model_path=path, context=SHAPES[shape], stream=stream)) as s:
        assert s.streaming is not None, s.notes
        if entries != "off":
            n = 3 if entries == "3" else s.n_expert * 3 // 2
            s.streaming.set_budget(n * s.streaming.info.entry_bytes)
        control = s.streaming
        before = control.counters()
        prefill: list[StreamCounters] = []
        first: list[npt.NDArray[np.float32]] = []

        def on_progress(p: Progress) -> None:
            if p.step == 1:  # the prefill is done, the first token not yet fed
                prefill.append(control.counters() - before)
                first.append(s.last_logits())

        text = prompt_of(path, PROMPTS[prompt])
        result = s.generate(GenerateRequest(text, n_predict=N_PREDICT), on_progress=on_progress)
        final = s.last_logits()
        logp = s.perplexity(text).logp
        streamer = control.streaming.streamer
        n_moe = sum(streamer.entry_bytes(layer) > 0 for layer in range(s.model.n_layer))
        got = Outcome(result.tokens, first[0], final, logp, result.n_prompt)
        return Streamed(got, prefill[0], control.counters(), control.resident_entries(), n_moe)


def assert_same(got: Outcome, want: Outcome, what: str) -> None:
    assert got.n_prompt == want.n_prompt, what
    assert got.tokens == want.tokens, what
    assert np.array_equal(got.prefill_logits, want.prefill_logits), f"{what}: prefill logits"
    assert np.array_equal(got.final_logits, want.final_logits), f"{what}: final logits"
    assert got.logp == want.logp, f"{what}: perplexity log-probs"


def no_timers(c: StreamCounters) -> StreamCounters:
    return c.decisions()


CACHES = [
    ("cache off", "off", True),
    ("3-entry cache", "3", True),
    ("1.5-layer cache, prefill read-ahead", "1.5 layers", True),
    ("1.5-layer cache, no prefill read-ahead", "1.5 layers", False),
]


@pytest.mark.parametrize("prompt", ["58 tokens", "64 tokens (ubatch boundary)"])
@pytest.mark.parametrize(("cache", "entries", "ahead"), CACHES, ids=[c[0] for c in CACHES])
def test_a_streamed_prefill_of_several_ubatches_equals_the_resident_one(
    fixture_name: str, tiny_model_path: TinyModel, prompt: str, cache: str, entries: str, ahead: bool
) -> None:
    path = tiny_model_path(fixture_name)
    want = resident(path, "b16", prompt)
    assert want.n_prompt == PROMPTS[prompt]
    runs = {
        policy: streamed(path, "b16", prompt, entries=entries, policy=policy, ahead=ahead)
        for policy in ("fast", "reference")
    }
    for policy, got in runs.items():
        assert_same(got.outcome, want, f"{cache}, {policy} policy")
        # the prefill really was several ubatches: each MoE layer served per ubatch
        n_ubatches = -(-want.n_prompt // UBATCH)
        assert got.served_every_ubatch(n_ubatches), (policy, got.prefill.requests, got.n_moe_layers)
        assert got.counters.misses > 0
        if entries != "off":
            assert got.counters.evictions > 0, f"{cache}: the cache must evict"
        if entries == "1.5 layers":  # room for reads ahead: the switch decides
            assert (got.prefill.prefetch_issued > 0) == ahead, cache
    fast, ref = runs["fast"], runs["reference"]
    assert no_timers(fast.counters) == no_timers(ref.counters)
    assert no_timers(fast.prefill) == no_timers(ref.prefill)
    assert fast.resident == ref.resident


@pytest.mark.parametrize("ahead", [True, False], ids=["prefill read-ahead", "no prefill read-ahead"])
def test_a_batch_split_into_ubatches_by_llama_cpp_streams_exactly(
    fixture_name: str, tiny_model_path: TinyModel, ahead: bool
) -> None:
    """``n_batch`` 64, ``n_ubatch`` 16: one ``llama_decode`` of four ubatches, then a second
    batch; the streamer serves each ubatch inside the call."""
    path = tiny_model_path(fixture_name)
    prompt = "70 tokens (two batches)"
    want = resident(path, "b64-ub16", prompt)
    runs = {
        policy: streamed(path, "b64-ub16", prompt, entries="1.5 layers", policy=policy, ahead=ahead)
        for policy in ("fast", "reference")
    }
    for policy, got in runs.items():
        assert_same(got.outcome, want, f"{policy} policy")
        assert got.served_every_ubatch(5), (policy, got.prefill.requests)  # ubatches 16, 16, 16, 16, 6
        assert got.counters.evictions > 0
        assert (got.prefill.prefetch_issued > 0) == ahead
    fast, ref = runs["fast"], runs["reference"]
    assert no_timers(fast.counters) == no_timers(ref.counters)
    assert fast.resident == ref.resident
