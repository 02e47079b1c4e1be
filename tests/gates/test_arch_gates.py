"""Every architecture of the expert registry (``bmoe.domain.moe_arch``) on its generated tiny
fixture (``ARCH_FIXTURES``): streamed equals resident bit for bit (G1 cache off, G2 a
one-entry budget), reads matter (negative control), a warm second generate equals a cold
one-shot run (S1, resident and streamed), and the reference policy equals the fast path.

A registry entry without a fixture fails here: an architecture is streamed only if it is
gated. The fixtures' shapes and purposes are in docs/models.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from bmoe.adapters.llama import ContextParams
from bmoe.cext import expert_stream
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.moe_arch import ARCHS
from bmoe.domain.streaming import StreamConfig, StreamCounters
from bmoe.runtime import Session, SessionConfig, run
from bmoe.testing.fixtures import ARCH_FIXTURES, FIXTURES, get_spec
from bmoe.tinymodel.spec import row_bytes

PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
PROMPT = "The quick brown fox jumps over the lazy dog"
REQUEST = GenerateRequest(PROMPT, n_predict=16)
WARM_UP = GenerateRequest("Warm the cache up with something else", n_predict=8)
EXPERT_TENSOR = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight")

TinyModel = Callable[[str], Path]


@functools.cache
def resident(path: Path) -> tuple[tuple[int, ...], np.ndarray]:
    with Session.open(SessionConfig(model_path=path, context=PARAMS)) as s:
        result = s.generate(REQUEST)
        return result.tokens, s.last_logits()


def streamed(path: Path, *, budget_entries: int | None, policy: str = "fast") -> Session:
    """A streamed session; ``budget_entries`` None: the cache off, else that many entries."""
    stream = StreamConfig(enabled=True, cache_mb=0, policy=policy)
    session = Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream))
    assert session.streaming is not None, session.notes
    assert session.notes == [] if policy == "fast" else len(session.notes) == 1
    if budget_entries is not None:
        session.streaming.set_budget(budget_entries * session.streaming.info.entry_bytes)
    return session


def header_entry_bytes(path: Path, n_layer: int) -> list[int]:
    """Per layer, the bytes of one expert over all its routed-expert tensors, from the GGUF header."""
    sizes = [0] * n_layer
    for tensor in GGUFReader(path).tensors:
        match = EXPERT_TENSOR.fullmatch(tensor.name)
        if match:
            sizes[int(match.group(1))] += int(tensor.n_bytes) // int(tensor.shape[-1])
    return sizes


def same_counters(a: StreamCounters, b: StreamCounters) -> bool:
    """Every counter the policy decides."""
    return a.decisions() == b.decisions()


@pytest.fixture(params=sorted(ARCHS))
def arch_path(request: pytest.FixtureRequest, tiny_model_path: TinyModel) -> Path:
    """The fixture of each registry architecture in turn."""
    arch = str(request.param)
    if arch not in ARCH_FIXTURES:
        pytest.fail(f"architecture {arch!r} is in the expert registry but has no fixture")
    return tiny_model_path(ARCH_FIXTURES[arch])


def test_every_registry_architecture_has_a_fixture_of_that_architecture() -> None:
    assert sorted(set(ARCHS) - set(ARCH_FIXTURES)) == []
    for arch in ARCHS:
        assert FIXTURES[ARCH_FIXTURES[arch]].arch == arch
    unregistered = {spec.arch for spec in FIXTURES.values()} - set(ARCHS)
    assert unregistered == set(), "a MoE fixture of an architecture bmoe does not stream"


@pytest.mark.parametrize(("gate", "budget_entries"), [("G1 cache off", None), ("G2 one-entry cache", 1)])
def test_streamed_equals_resident_and_every_expert_tensor_is_streamed(
    arch_path: Path, gate: str, budget_entries: int | None
) -> None:
    tokens, logits = resident(arch_path)
    with streamed(arch_path, budget_entries=budget_entries) as s:
        result = s.generate(REQUEST)
        assert result.tokens == tokens, gate
        assert np.array_equal(s.last_logits(), logits), gate
        counters = s.streaming.counters()
        streamer = s.streaming.streaming.streamer
        sizes = [streamer.entry_bytes(layer) for layer in range(s.model.n_layer)]
    assert sizes == header_entry_bytes(arch_path, len(sizes))
    assert max(sizes) > 0
    assert result.stream is not None and result.stream.decode.evictions > 0
    assert counters.misses > 0 and counters.evictions > 0


def test_negative_control_without_reads_the_logits_change(arch_path: Path) -> None:
    """The experts matter on every fixture, so the gates' bit-for-bit logits can fail:
    unread (zero) experts change them. (Not always the greedy tokens: olmoe's top-k weights
    are not renormalised, and its random experts move the logits less than the argmax gap.)"""
    _, logits = resident(arch_path)
    with streamed(arch_path, budget_entries=None) as s:
        s.streaming.streaming.streamer.mode = expert_stream.MODE_OFF
        s.generate(REQUEST)
        assert s.streaming.counters().bytes_read == 0
        assert not np.array_equal(s.last_logits(), logits)


@pytest.mark.parametrize("mode", ["resident", "streamed, 3-entry cache"])
def test_s1_a_warm_second_generate_equals_the_cold_one_shot_run(arch_path: Path, mode: str) -> None:
    cold = run(SessionConfig(model_path=arch_path, context=PARAMS), REQUEST)
    _, cold_logits = resident(arch_path)
    if mode == "resident":
        session = Session.open(SessionConfig(model_path=arch_path, context=PARAMS))
    else:
        session = streamed(arch_path, budget_entries=3)
    with session:
        session.generate(WARM_UP)
        warm = session.generate(REQUEST)
        warm_logits = session.last_logits()
    assert len(warm.tokens) == REQUEST.n_predict
    assert warm.tokens == cold.tokens and warm.text == cold.text
    assert np.array_equal(warm_logits, cold_logits)


def test_the_reference_policy_and_the_fast_path_agree_on_everything(arch_path: Path) -> None:
    """Tokens, logits, log-probs, every counter and the LRU order over two requests and a
    perplexity, through a 3-entry cache."""
    runs = {}
    for policy in ("fast", "reference"):
        with streamed(arch_path, budget_entries=3, policy=policy) as s:
            first = s.generate(WARM_UP)
            second = s.generate(REQUEST)
            logits = s.last_logits()
            ppl = s.perplexity(PROMPT)
            runs[policy] = (
                (first.tokens, second.tokens),
                logits,
                ppl.logp,
                s.streaming.counters(),
                s.streaming.resident_entries(),
                second.stream,
            )
    fast, ref = runs["fast"], runs["reference"]
    assert fast[0] == ref[0]
    assert np.array_equal(fast[1], ref[1]) and fast[2] == ref[2]
    assert same_counters(fast[3], ref[3]) and fast[3].evictions > 0
    assert fast[4] == ref[4]
    assert fast[5] is not None and ref[5] is not None
    assert same_counters(fast[5].prefill, ref[5].prefill) and same_counters(fast[5].decode, ref[5].decode)


def test_the_mixed_precision_fixture_has_per_layer_entry_sizes(tiny_model_path: TinyModel) -> None:
    """``mixtral`` stores some layers' ``ffn_down_exps`` wider (as Q4_K_M files do): the
    streamer's entry of those layers is larger, as the spec says."""
    spec = get_spec("mixtral")
    dims, mixed = spec.dims, spec.mixed
    assert mixed is not None
    gate_up = 2 * dims.n_ff_exp * row_bytes(dims.expert_dtype, dims.n_embd)
    expected = [
        gate_up + dims.n_embd * row_bytes(mixed.down_dtype(il, dims.expert_dtype), dims.n_ff_exp)
        for il in range(dims.n_layer)
    ]
    assert len(set(expected)) == 2
    path = tiny_model_path("mixtral")
    with streamed(path, budget_entries=None) as s:
        streamer = s.streaming.streaming.streamer
        assert [streamer.entry_bytes(il) for il in range(dims.n_layer)] == expected
        assert s.streaming.info.entry_bytes == max(expected)
