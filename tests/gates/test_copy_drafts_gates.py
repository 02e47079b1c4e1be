"""Copy drafts on llama.cpp (``--draft copy``): streamed equals resident with drafting on, bit
for bit (the same batches); a rejected draft is cut so that the KV holds what plain steps
leave; cancel and parallel sequences still work. Against drafting off, the greedy tokens
are compared and any difference is shown with its logit margin (a batch's logits are not a
single step's in their last bits).

The random-weight fixture rarely repeats eight tokens of its context, so the gates draft
behind matches of one token (``DraftPolicy(min_match=1)``): many verifies, most rejected,
which is what the cut and the exactness need exercised.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest

import bmoe
from bmoe.adapters.llama import ContextParams
from bmoe.domain.drafting import DraftPolicy
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig

PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
EAGER = DraftPolicy(min_match=1, min_draft=4, max_draft=16)
TEXT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 2
REQUEST = GenerateRequest(TEXT, n_predict=40)


def session(
    draft: str, stream: bool = False, cache_mb: int | None = 1, context: ContextParams = PARAMS
) -> Session:
    config = SessionConfig(
        model_path=bmoe.default_model_path(),
        context=context,
        draft=draft,  # type: ignore[arg-type]
        draft_policy=EAGER,
        stream=StreamConfig(enabled=stream, cache_mb=cache_mb),
    )
    return Session.open(config)


def pos_max(s: Session) -> int:
    return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(s.ctx.ptr), 0))


@pytest.mark.parametrize("cache_mb", [1, 4000, None], ids=["cache-1MiB", "cache-all", "cache-auto"])
def test_streamed_equals_resident_with_drafting_on(cache_mb: int | None) -> None:
    with session("copy") as s:
        want = s.generate(REQUEST)
        logits = s.last_logits()
    assert want.drafts is not None and want.drafts.verifies > 0, want.drafts
    with session("copy", stream=True, cache_mb=cache_mb) as s:
        assert s.streaming is not None
        got = s.generate(REQUEST)
        assert got.tokens == want.tokens
        assert np.array_equal(s.last_logits(), logits)
        assert got.drafts == want.drafts
        assert got.stream is not None and got.stream.prefill.bytes_read + got.stream.decode.bytes_read > 0


def test_after_drafts_the_kv_holds_what_plain_steps_leave() -> None:
    with session("copy") as s:
        result = s.generate(REQUEST)
        n_prompt = len(s.engine.render_prompt(REQUEST, history=None, chat=False))
        assert result.drafts is not None and result.drafts.accepted < result.drafts.drafted
        kept = n_prompt + len(result.tokens) - 1  # the last token is never fed
        assert len(s.engine.kv_tokens) == kept
        assert pos_max(s) == kept - 1
        again = s.generate(GenerateRequest(" more", n_predict=8, clear_kv=False))
    with session("copy") as fresh:
        fresh.generate(REQUEST)
        assert fresh.generate(GenerateRequest(" more", n_predict=8, clear_kv=False)).tokens == again.tokens


def test_drafting_against_off_the_same_greedy_tokens_or_a_near_tie() -> None:
    with session("off") as s:
        plain = s.generate(REQUEST)
    with session("copy") as s:
        drafted = s.generate(REQUEST)
    if drafted.tokens == plain.tokens:
        return
    first = next(i for i, (a, b) in enumerate(zip(drafted.tokens, plain.tokens, strict=False)) if a != b)
    with session("off") as s:  # the plain run's logits at the first difference: how near the tie
        s.generate(GenerateRequest(TEXT, n_predict=first))
        if first:
            s.engine.backend.feed([plain.tokens[first - 1]], len(s.engine.kv_tokens))
        logits = s.last_logits()
    margin = float(logits[plain.tokens[first]] - logits[drafted.tokens[first]])
    assert 0 <= margin < 1e-3, (
        f"token {first}: drafting chose {drafted.tokens[first]}, off {plain.tokens[first]}, margin {margin}"
    )


def test_a_cancel_in_a_drafted_request_leaves_the_session_as_a_fresh_one() -> None:
    with session("copy") as s:
        seen = []

        def cancel_at_ten(progress: object) -> None:
            seen.append(progress)
            if len(seen) == 10:
                s.cancel()

        cancelled = s.generate(REQUEST, on_progress=cancel_at_ten)
        assert cancelled.cancelled
        after = s.generate(REQUEST)
    with session("copy") as fresh:
        assert fresh.generate(REQUEST).tokens == after.tokens


def test_parallel_sequences_run_with_drafting_on_as_without() -> None:
    params = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off", n_seq_max=2)
    requests = [GenerateRequest(TEXT, n_predict=12), GenerateRequest("Hello there", n_predict=12)]
    got = {}
    for draft in ("off", "copy"):
        with session(draft, context=params) as s:
            got[draft] = [r.tokens for r in s.generate_batch(requests)]
    assert got["copy"] == got["off"]


def test_a_model_whose_memory_cannot_be_cut_does_not_draft(tiny_model_path) -> None:  # type: ignore[no-untyped-def]
    config = SessionConfig(model_path=Path(tiny_model_path("qwen35moe")), context=PARAMS, draft="copy")
    with Session.open(config) as s:
        assert any(note.startswith("draft: copy drafts need a memory") for note in s.notes), s.notes
        assert s.generate(GenerateRequest(TEXT, n_predict=4)).drafts is None


def test_a_verify_is_one_decode_step_of_its_rows_for_the_streamer() -> None:
    """A verify's batch reads its rows' experts as a decode step does: not as a prefill's,
    which reads the whole next layer ahead where it routes half a layer's experts (on a MoE
    that made every verify read every expert). The decode steps of this model read nothing
    ahead, so a drafted request issues the read-aheads of its prompt's prefill only, as the
    same request without drafts does (without the hook: 46 against 12)."""
    issued = {}
    for draft in ("off", "copy"):
        with session(draft, stream=True, cache_mb=1) as s:
            assert s.streaming is not None
            result = s.generate(REQUEST)
            issued[draft] = s.streaming.counters().prefetch_issued
            if draft == "copy":
                assert result.drafts is not None and result.drafts.verifies > 0
    assert issued["copy"] == issued["off"] > 0
