"""Decision gates G18a-c on the tiny fixtures (resident), over ``LlamaDecideBackend`` and
``run_decide`` alone. G18a and G18b compare logits, log-probs and saved states bit for bit
(the reference feeds the same token pieces, so llama.cpp rounds the same); G18c compares
logits bit for bit with stock llama-cpp-python (same batch shape, one output row) and the
log-probs within 1e-5 of a float64 log-softmax of its logits written here.

qwen35moe is hybrid (recurrent + attention): its memory cannot be trimmed back to a prefix,
so these gates are where restoring a recurrent state is shown exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest

from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.adapters.llama.decide_backend import LlamaDecideBackend, save_seq_state
from bmoe.domain.decide import DecideConfig, DecideRequest, DecideResult, LastPrefixCache, score_choices
from bmoe.service.decider import run_decide

TinyModel = Callable[[str], Path]
FIXTURES = ["qwen3moe", "qwen35moe"]
# one llama_decode per piece, split into ubatches of 64 the same way by us and by stock llama.cpp
PARAMS = ContextParams(n_ctx=256, n_batch=256, n_ubatch=64, n_threads=2, flash_attn="off")
ON = DecideConfig(enabled=True)
ABC = ("A", "B", "C")

TASK = "Task: turn on Wi-Fi. History: asked the expert"
GROWN = TASK + "s, opened Settings"
# (prefix, suffix, reuse_prefix, whether the kept state is restored)
AGENT = [
    (TASK, ". Screen: Home. Options: A) Settings B) Phone C) Mail. Answer with the letter.", True, False),
    # " expert" + "s" is one token (" experts"): only the give-back lets the state be reused
    (TASK + "s", ". Screen: Settings. Options: A) Network B) Display C) Battery.", True, True),
    (TASK + "s", ". Screen: Settings, scrolled. Options: A) Network B) Sound C) About.", True, True),
    (GROWN, ". Screen: Network. Options: A) Wi-Fi B) Mobile C) VPN.", True, True),
    (GROWN, ". Screen: Network. Options: A) Wi-Fi B) Mobile C) VPN.", False, False),
    (GROWN, ". Screen: Wi-Fi. Options: A) On B) Off C) Back.", True, True),
]


class Engine:
    """A model, a fresh context and the decide backend over them (close it)."""

    def __init__(self, model: LlamaModel) -> None:
        self.ctx = LlamaContext(model, PARAMS)
        self.backend = LlamaDecideBackend(model, self.ctx, JinjaChatTemplate(model.chat_template))
        self.choice_tokens = [self.backend.tokenize(c, special=False)[0] for c in ABC]

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ctx.close()

    def tokens(self, prefix: str, suffix: str) -> list[int]:
        return self.backend.tokenize(self.backend.render(prefix + suffix), special=True)

    def feed(self, tokens: list[int], cuts: list[int]) -> None:
        """Empty the memory, then prefill ``tokens`` in the pieces ending at ``cuts``."""
        self.backend.reset()
        start = 0
        for cut in cuts:
            self.backend.prefill(tokens[start:cut], start)
            start = cut


@attrs.frozen
class Decision:
    tokens: list[int]
    cuts: list[int]  # where the pieces it was computed in end, restored ones included
    result: DecideResult
    logits: npt.NDArray[np.float32]


@pytest.fixture
def model(request: pytest.FixtureRequest, tiny_model_path: TinyModel) -> Iterator[LlamaModel]:
    with LlamaModel(tiny_model_path(request.param)) as loaded:
        yield loaded


def run_agent(engine: Engine, cache: LastPrefixCache) -> list[Decision]:
    """Run AGENT, checking which decisions restored a kept state.

    A kept state's cuts are those of the state it was restored from plus its own length.
    """
    kept_cuts: dict[tuple[int, ...], list[int]] = {}
    out = []
    for prefix, suffix, reuse, restored in AGENT:
        tokens = engine.tokens(prefix, suffix)
        request = DecideRequest(prefix=prefix, suffix=suffix, choices=ABC, reuse_prefix=reuse)
        result = run_decide(engine.backend, cache, request, ON)
        assert (result.n_reused > 0) == restored, (prefix, result)
        cuts = list(kept_cuts[tuple(tokens[: result.n_reused])]) if result.n_reused else []
        if result.n_stored:
            cuts.append(result.n_stored)
            kept_cuts[tuple(tokens[: result.n_stored])] = list(cuts)
        out.append(Decision(tokens, [*cuts, len(tokens)], result, engine.backend.logits()))
    return out


@pytest.mark.parametrize("model", FIXTURES, indirect=True)
def test_g18a_restored_prefix_decisions_equal_a_fresh_computation_bit_for_bit(model: LlamaModel) -> None:
    """The reference is a fresh context that restores nothing: it prefills each decision's
    tokens in the pieces the kept states were built from."""
    with Engine(model) as engine, Engine(model) as fresh:
        decisions = run_agent(engine, LastPrefixCache())
        for d in decisions:
            fresh.feed(d.tokens, d.cuts)
            logits = fresh.backend.logits()
            reference = score_choices(logits, fresh.choice_tokens)
            assert np.array_equal(d.logits, logits)
            assert d.result.choice_logp == reference.logp and d.result.best == reference.best
            assert d.result.n_tokens == len(d.tokens)
    assert [len(d.cuts) for d in decisions] == [2, 2, 2, 3, 1, 3]


@pytest.mark.parametrize("model", FIXTURES, indirect=True)
def test_g18b_a_state_stored_after_a_partial_restore_equals_the_state_computed(model: LlamaModel) -> None:
    """The state of the grown prefix was stored by a decision that restored the shorter one
    and prefilled the difference: its bytes equal those of the same pieces prefilled in a
    fresh context, and loaded there it answers bit for bit as the computed state does."""
    with Engine(model) as engine, Engine(model) as fresh:
        cache = LastPrefixCache()
        decisions = run_agent(engine, cache)
        grown, later = decisions[3], decisions[5]
        assert grown.result.n_reused > 0 and grown.result.n_stored > grown.result.n_reused
        stored = cache.lookup(later.tokens)
        assert stored is not None and len(stored.tokens) == grown.result.n_stored
        fresh.feed(grown.tokens, grown.cuts[:-1])
        computed = save_seq_state(fresh.ctx)
        assert computed is not None and np.array_equal(stored.blob, computed)

        fresh.feed(later.tokens, later.cuts)
        from_computed = fresh.backend.logits()
        assert fresh.backend.load_state(stored.blob)
        fresh.backend.prefill(later.tokens[len(stored.tokens) :], len(stored.tokens))
        assert np.array_equal(fresh.backend.logits(), from_computed)


def log_softmax_f64(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """An independent reference: log(softmax) in float64, the plain way."""
    x = row.astype(np.float64)
    p = np.exp(x - x.max())
    out: npt.NDArray[np.float64] = np.log(p / p.sum())
    return out


@pytest.mark.parametrize("model", FIXTURES, indirect=True)
def test_g18c_a_whole_prefill_decision_equals_stock_llama_cpp_after_the_same_text(model: LlamaModel) -> None:
    """A decision that opts out of the kept state (after others, so the memory held
    something) is prefilled whole; stock llama-cpp-python fed the same rendered text with
    the same batch shape computes the same logits bit for bit, and the choices' log-probs
    are those logits' log-softmax (within 1e-5 of a float64 computation written here)."""
    prefix, suffix, _, _ = AGENT[3]
    with Engine(model) as engine:
        cache = LastPrefixCache()
        run_agent(engine, cache)
        request = DecideRequest(prefix=prefix, suffix=suffix, choices=ABC, reuse_prefix=False)
        result = run_decide(engine.backend, cache, request, ON)
        ours = engine.backend.logits()
        text = engine.backend.render(prefix + suffix)
        tokens = engine.backend.tokenize(text, special=True)
    assert (result.n_reused, result.n_prefilled) == (0, len(tokens))
    stock = llama_cpp.Llama(
        model_path=str(model.path),
        n_ctx=PARAMS.n_ctx,
        n_batch=PARAMS.n_batch,
        n_ubatch=PARAMS.n_ubatch,
        n_threads=PARAMS.n_threads,
        n_threads_batch=PARAMS.n_threads,
        flash_attn=False,
        verbose=False,
    )
    try:
        assert stock.tokenize(text.encode(), add_bos=True, special=True) == tokens
        stock.eval(tokens)
        theirs = np.ctypeslib.as_array(stock._ctx.get_logits_ith(-1), shape=(stock.n_vocab(),)).copy()
        choice_tokens = [stock.tokenize(c.encode(), add_bos=False, special=False)[0] for c in ABC]
    finally:
        stock.close()
    assert np.array_equal(ours, theirs)
    expected = log_softmax_f64(theirs)[choice_tokens]
    assert np.allclose(result.choice_logp, expected, rtol=0, atol=1e-5)
    assert result.best == int(np.argmax(expected))
    assert np.isclose(sum(result.choice_p_renorm), 1.0)


def pos_max(ctx: LlamaContext) -> int:
    return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(ctx.ptr), 0))


@pytest.mark.parametrize("model", FIXTURES, indirect=True)
def test_the_adapter_keeps_its_contract_on_refused_loads_and_stale_logits(model: LlamaModel) -> None:
    """Not a gate: a truncated state is refused and leaves the memory empty (hybrid memory
    would keep part of it), logits are never a stale row, and prompts render with
    reasoning off."""
    with Engine(model) as engine:
        text = engine.backend.render("Hi")
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        tokens = engine.tokens("Hi", " there")
        engine.feed(tokens, [len(tokens)])
        blob = engine.backend.save_state()
        assert blob is not None and not blob.flags.writeable
        assert not engine.backend.load_state(blob[: blob.size // 3])
        assert pos_max(engine.ctx) == -1
        with pytest.raises(ValueError, match="no logits"):
            engine.backend.logits()
        assert engine.backend.load_state(blob)
        assert pos_max(engine.ctx) == len(tokens) - 1
        with pytest.raises(ValueError, match="no logits"):
            engine.backend.logits()
