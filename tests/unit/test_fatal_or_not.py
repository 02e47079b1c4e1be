"""Fatal means the engine is broken: one rule (``bmoe.errors.is_fatal``) by the error's type,
and what a request brought (its constraint dead-ending while generating) ends that request
only, rolled back as a cancel, the next one answered as a fresh session answers it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from test_batch_generation import ScriptedBatch
from test_session_engine import TinyTemplate, answer_then_stop

from bmoe.domain.generation import GenerateRequest
from bmoe.domain.schema_dead_ends import dead_end
from bmoe.domain.schema_rules import enforceable
from bmoe.errors import (
    ContextOverflowError,
    DecodeAbortedError,
    DecodeError,
    ExpertGraphError,
    ExpertReadError,
    GrammarError,
    KvCacheFullError,
    ModelFileTruncatedError,
    RequestError,
    SessionFailedError,
    TokenizeError,
    ToolFormatError,
    is_fatal,
)
from bmoe.service.batch_generation import BatchJob, run_batch
from bmoe.service.session_engine import EngineDefaults, SessionEngine
from bmoe.testing.fake_backend import ScriptedGenerateBackend

FATAL = [
    ExpertReadError("read failed"),
    ExpertGraphError("a layer without known experts"),
    ModelFileTruncatedError("truncated"),
    DecodeError("llama_decode failed", -3),
    KvCacheFullError("no slot", 1),
    SessionFailedError("ended earlier"),
]
NOT_FATAL = [
    GrammarError("the schema allows no value"),
    ContextOverflowError("too long"),
    TokenizeError("not Unicode"),
    ToolFormatError("no syntax"),
    RequestError("bad field", "messages"),
    DecodeAbortedError("aborted", 2),
    ValueError("a bug of Python's"),
]


@pytest.mark.parametrize("error", FATAL, ids=lambda e: type(e).__name__)
def test_what_breaks_the_engine_is_fatal(error: Exception) -> None:
    assert is_fatal(error)


@pytest.mark.parametrize("error", NOT_FATAL, ids=lambda e: type(e).__name__)
def test_what_a_request_brought_is_not(error: Exception) -> None:
    assert not is_fatal(error)


def _dead_ends_at(n: int, answer: str) -> object:
    """``answer_then_stop(answer)``, but the constraint dead-ends at the reply's ``n``-th token."""
    script = answer_then_stop(answer)

    def next_token(context: Sequence[int]) -> int:
        text = bytes(context).decode()
        if len(text) - text.rfind("<a>") - 3 >= n and "bad" in text[text.rfind("<u>") :]:
            raise GrammarError("the schema at response_format.json_schema.schema allows no complete value")
        return script(context)  # type: ignore[operator,no-any-return]

    return next_token


def test_a_constraint_dead_ending_mid_reply_ends_that_request_only() -> None:
    backend = ScriptedGenerateBackend(256, _dead_ends_at(2, "hello"))  # type: ignore[arg-type]
    engine = SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=True, n_predict=32))
    first = engine.generate(GenerateRequest("q"))
    history = list(engine.history)
    with pytest.raises(GrammarError):
        engine.generate(GenerateRequest("bad", clear_kv=False))
    assert engine.failed is None
    assert backend.context == engine.kv_tokens  # rolled back to what the engine says it holds
    assert engine.history == history  # the failed turn joined no history
    again = engine.generate(GenerateRequest("q"))
    assert again.tokens == first.tokens


def test_a_decode_failing_inside_llama_cpp_stays_fatal() -> None:
    backend = ScriptedGenerateBackend(256, answer_then_stop("hi"), fail_at=2)
    engine = SessionEngine(backend, TinyTemplate(), EngineDefaults(chat=True, n_predict=32))
    with pytest.raises(DecodeError):
        engine.generate(GenerateRequest("q"))
    with pytest.raises(SessionFailedError):
        engine.generate(GenerateRequest("q"))


class _DeadEndingBatch(ScriptedBatch):
    """A sequence whose prompt starts with 50 dead-ends at its second token."""

    def sample(self, seq: int, row: int) -> int:
        token = super().sample(seq, row)
        if token == 52:
            raise GrammarError("the schema allows no complete value")
        return token


def test_a_parallel_sequence_dead_ending_frees_its_slot_and_the_others_run_on() -> None:
    backend = _DeadEndingBatch(n_seq=2)
    with pytest.raises(GrammarError):
        run_batch(backend, [BatchJob((10,), 3), BatchJob((50,), 4), BatchJob((30,), 2)])
    assert 1 in backend.dropped  # the failed one's KV (slot 1) went; job 2 took that slot
    alone = run_batch(ScriptedBatch(n_seq=2), [BatchJob((10,), 3), BatchJob((30,), 2)])
    assert [o.tokens for o in alone] == [(11, 12, 13), (31, 32)]


SELF = {"$ref": "#"}
REQUIRED_CHILD = {
    "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
    "$ref": "#/$defs/n",
}


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (SELF, "a reference to itself"),
        (REQUIRED_CHILD, "a recursion with no way out"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
            "recursion",
        ),
        (
            {
                "type": "object",
                "properties": {"k": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}},
                "required": ["k"],
            },
            "recursion",
        ),
    ],
)
def test_a_schema_with_no_finite_value_is_refused_before_any_grammar(schema: object, why: str) -> None:
    with pytest.raises(GrammarError, match=why) as caught:
        enforceable(schema, "response_format.json_schema.schema", frozenset())
    assert caught.value.where == "response_format.json_schema.schema"
    assert "allows no value" in str(caught.value) and len(str(caught.value)) < 200


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
        {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#"}}}, "required": ["k"]},
        {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        {"type": ["object", "null"], "properties": {"c": {"$ref": "#"}}, "required": ["c"]},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "string"}}, "$ref": "#/$defs/a"},
        {"$ref": "#anchor"},
        {"$ref": "https://example.com/other.json"},
    ],
)
def test_a_recursion_with_a_way_out_is_left_to_the_engine(schema: object) -> None:
    assert dead_end(schema) is None
