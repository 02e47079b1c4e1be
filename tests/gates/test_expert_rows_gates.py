"""Expert rows (``cext/stream/rows.pxi``): each expert read into another row of its layer's
tensors, the routing ids rewritten to rows once the router's weights are gathered; the output
equals the resident run's bit for bit, prompt and decode, a cache that evicts on every token
and one that holds every expert, on every MoE architecture; a layout rows cannot serve is a
named fault, never another output."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.cext.expert_stream import shuffled_rows
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.moe_arch import serves_expert_rows
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import EngineOptions, StreamConfig
from bmoe.domain.streaming.scope_twin import other_scope
from bmoe.domain.streaming.victims import VictimsSetting
from bmoe.domain.streaming.victims_chooser import ScopeVerdict, ScopeWindow, VictimsChooser
from bmoe.errors import ExpertGraphError
from bmoe.runtime import Session, SessionConfig, victims_control
from bmoe.runtime import streaming as streaming_runtime
from bmoe.testing.fixtures import ARCH_FIXTURES

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
REQUEST = GenerateRequest("Hello, world", n_predict=12, sampling=SamplingParams(temp=1.0, seed=5))
FIXTURES = sorted({*ARCH_FIXTURES.values(), "qwen3moe-odd", "qwen3moe-split"})

Output = tuple[tuple[int, ...], np.ndarray]


def resident(path: Path) -> Output:
    with Session.open(SessionConfig(model_path=path, context=PARAMS)) as s:
        return tuple(s.generate(REQUEST).tokens), s.last_logits()


def shuffled(path: Path, *, whole: bool, pass_layers: bool = False) -> tuple[Output, dict[str, Any]]:
    """Streamed with every expert in a shuffled row; the cache one layer's top-k and two more
    (``whole``: every expert)."""
    engine = EngineOptions(rank_worker=True, expert_rows="shuffled")
    stream = StreamConfig(enabled=True, cache_mb=None, engine=engine, pass_layers=pass_layers)
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        assert s.streaming is not None
        m = s.model
        entries = m.n_layer * m.n_expert if whole else m.n_expert_used + 2
        s.streaming.set_budget(entries * s.streaming.info.entry_bytes)
        out = tuple(s.generate(REQUEST).tokens), s.last_logits()
        return out, s.streaming.streaming.streamer.stats()


ARCH_OF = {fixture: arch for arch, fixture in ARCH_FIXTURES.items()}
SERVED = [n for n in FIXTURES if serves_expert_rows(ARCH_OF.get(n, "qwen3moe"))]
GATHERED = [n for n in FIXTURES if n not in SERVED]


@pytest.mark.parametrize("name", SERVED)
def test_experts_in_shuffled_rows_give_the_resident_output(tiny_model_path: TinyModel, name: str) -> None:
    path = tiny_model_path(name)
    tokens, logits = resident(path)
    for whole, pass_layers in ((False, False), (True, True)):
        (got_tokens, got_logits), stats = shuffled(path, whole=whole, pass_layers=pass_layers)
        assert got_tokens == tokens and np.array_equal(got_logits, logits), (whole, pass_layers)
        assert stats["rows_rewritten"] > 0


@pytest.mark.parametrize("name", GATHERED)
def test_a_graph_that_gathers_per_expert_tensors_by_id_is_a_named_fault(
    tiny_model_path: TinyModel, name: str
) -> None:
    """gpt-oss adds per-expert biases by id, gemma4 gathers per-expert scales: with the ids
    rewritten to rows they would read another expert's; the decode stops, named."""
    with pytest.raises(ExpertGraphError, match="rows are not rewritten"):
        shuffled(tiny_model_path(name), whole=False)


def test_the_architectures_rows_cannot_serve_are_those_the_gates_fault_on() -> None:
    assert sorted(ARCH_FIXTURES[a] for a in ("gpt-oss", "gemma4")) == GATHERED


def test_the_shuffled_rows_are_permutations_that_move_almost_every_expert() -> None:
    rows = shuffled_rows(3, 8)
    assert rows.shape == (3, 8)
    for layer in range(3):
        assert sorted(rows[layer]) == list(range(8))
        assert (rows[layer] != np.arange(8)).sum() >= 6
    assert not np.array_equal(rows[0], rows[1])


def test_a_long_prompt_and_reads_ahead_into_shuffled_rows_give_the_resident_output(
    tiny_model_path: TinyModel,
) -> None:
    """A prompt of several batches (each layer's whole set read ahead), then guesses read
    ahead of need during decode: every read lands in its row."""
    path = tiny_model_path("qwen3moe")
    request = GenerateRequest(" ".join(["the quick brown fox jumps over the lazy dog"] * 8), n_predict=8)
    with Session.open(SessionConfig(model_path=path, context=PARAMS)) as s:
        tokens, logits = tuple(s.generate(request).tokens), s.last_logits()
    engine = EngineOptions(rank_worker=True, expert_rows="shuffled")
    stream = StreamConfig(enabled=True, cache_mb=None, engine=engine, predict_prefetch=True)
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        assert s.streaming is not None
        s.streaming.set_budget((s.model.n_expert_used + 2) * s.streaming.info.entry_bytes)
        result = s.generate(request)
        assert result.n_prompt >= 2 * PARAMS.n_batch
        assert tuple(result.tokens) == tokens and np.array_equal(s.last_logits(), logits)
        assert s.streaming.counters().prefetch_issued > 0


def test_rows_are_permutations_set_before_the_first_read(tiny_model_path: TinyModel) -> None:
    stream = StreamConfig(enabled=True, cache_mb=None, victims="global")
    with Session.open(
        SessionConfig(model_path=tiny_model_path("qwen3moe"), context=PARAMS, stream=stream)
    ) as s:
        assert s.streaming is not None
        streamer = s.streaming.streaming.streamer
        n_layer, n_expert = s.model.n_layer, s.model.n_expert
        with pytest.raises(ValueError, match="permutation"):
            streamer.set_rows(np.zeros((n_layer, n_expert), dtype=np.int32))
        with pytest.raises(ValueError, match="rows must be"):
            streamer.set_rows(np.zeros((1, 2), dtype=np.int32))
        s.generate(REQUEST)
        with pytest.raises(ValueError, match="before the first read"):
            streamer.set_rows(shuffled_rows(n_layer, n_expert))
        assert streamer.stats()["rows_rewritten"] == 0  # global victims, no rows: no id rewritten


def two_tokens_a_layer(s: Session) -> Any:
    """Each MoE layer's share of the cache two tokens' top-k: where a miss takes its own
    layer's victim (``--cache-victims layer``). Returns the C streamer."""
    assert s.streaming is not None
    streamer = s.streaming.streaming.streamer
    n_moe = sum(1 for layer in range(s.model.n_layer) if streamer.entry_bytes(layer) > 0)
    s.streaming.set_budget(2 * s.model.n_expert_used * n_moe * s.streaming.info.entry_bytes)
    return streamer


@pytest.mark.parametrize("name", SERVED)
def test_misses_read_into_their_victims_rows_give_the_resident_output(
    tiny_model_path: TinyModel, name: str
) -> None:
    """``--cache-victims layer``: each layer's share holds two tokens' top-k, a miss evicts its
    own layer's entry and is read into that entry's row (no page moved)."""
    path = tiny_model_path(name)
    tokens, logits = resident(path)
    stream = StreamConfig(enabled=True, cache_mb=None, victims="layer")
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        m = s.model
        streamer = two_tokens_a_layer(s)
        result = s.generate(REQUEST)
        stats = streamer.stats()
        assert tuple(result.tokens) == tokens and np.array_equal(s.last_logits(), logits)
        assert stats["rows_rewritten"] > 0
        if 2 * m.n_expert_used < m.n_expert:  # else the share holds every expert: nothing evicted
            assert stats["rows_swapped"] > 0


class FlippingChooser(VictimsChooser):
    """Changes the scope at every window, whatever the costs: the switch itself under test."""

    def observe(self, window: ScopeWindow) -> ScopeVerdict:
        self.scope = other_scope(self.scope)
        self.switches += 1
        return ScopeVerdict(other_scope(self.scope), None, None, True)


@pytest.mark.parametrize("name", SERVED)
def test_the_victims_scope_changed_between_decode_steps_gives_the_resident_output(
    tiny_model_path: TinyModel, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cache-victims auto``: the scope changes every 2 decode steps (a scripted chooser),
    the twin runs the other; the output is the resident run's bit for bit."""
    monkeypatch.setattr(victims_control, "VictimsChooser", FlippingChooser)
    monkeypatch.setattr(
        streaming_runtime, "VictimsControl", partial(victims_control.VictimsControl, window_tokens=2)
    )
    path = tiny_model_path(name)
    tokens, logits = resident(path)
    stream = StreamConfig(enabled=True, cache_mb=None, victims="auto")
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        m = s.model
        streamer = two_tokens_a_layer(s)
        result = s.generate(REQUEST)
        assert s.streaming is not None
        counters = s.streaming.counters()
        assert tuple(result.tokens) == tokens and np.array_equal(s.last_logits(), logits)
        assert streamer.settings()["victims"] == "auto"
        assert counters.victims_switches >= 4 and counters.twin_misses > 0
        if 2 * m.n_expert_used < m.n_expert:  # else the share holds every expert: nothing evicted
            assert streamer.stats()["rows_swapped"] > 0


@pytest.mark.parametrize("name", GATHERED)
@pytest.mark.parametrize("victims", ["layer", "auto"])
def test_layer_victims_where_rows_cannot_serve_fall_back_to_global_victims(
    tiny_model_path: TinyModel, name: str, victims: VictimsSetting
) -> None:
    path = tiny_model_path(name)
    tokens, logits = resident(path)
    stream = StreamConfig(enabled=True, cache_mb=None, victims=victims)
    with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
        assert s.streaming is not None
        s.streaming.set_budget((s.model.n_expert_used + 2) * s.streaming.info.entry_bytes)
        result = s.generate(REQUEST)
        assert tuple(result.tokens) == tokens and np.array_equal(s.last_logits(), logits)
        assert s.streaming.streaming.streamer.settings()["victims"] == "global"
