"""Constraints enforced by llguidance, the engine llama.cpp itself links (``-DLLAMA_LLGUIDANCE``).

llguidance (``.venv/bin/pip install -e '.[grammar]'`` from a checkout) reads JSON Schema
as agent frameworks write it: numeric bounds (``minimum``, ``exclusiveMaximum``,
``multipleOf``...), ``minProperties``, ``patternProperties``, ``pattern``. It computes each
step's token mask from the model's own vocabulary (read once per model through llama.cpp's
API, ``llguidance.llamacpp``), and ``MaskSampler`` applies it inside llama.cpp's sampler
chain.

A constraint becomes one Lark grammar (llguidance's format): a JSON answer is
``%json {schema}``; a call is the family's syntax around the tool's ``%json`` arguments,
with the syntax's special tokens (``<tool_call>``, ``<|channel|>``) written as tokens, not
spelled from bytes; tools beside an answer are ``start: answer | calls``. JSON is written
compact, with OpenAI's separators (``", "``, ``": "``): no runs of blanks.

What llguidance does not enforce (``REFUSED``, and any format ``schema_rules`` does not
write) is refused before any grammar is built, with its JSON pointer.
"""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bmoe.adapters.llama.model import LlamaModel
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.schema_rules import enforceable
from bmoe.domain.tools import CallSyntax, Tool
from bmoe.errors import GrammarError

try:
    import llguidance
    import llguidance.llamacpp
except ImportError:  # the optional extra is absent: llama-cpp-python's converter stands in
    llguidance = None  # type: ignore[assignment]

REFUSED = frozenset(
    {
        "uniqueItems",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "propertyNames",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
    }
)
"""Keywords that restrict what is valid and that llguidance does not enforce (it says
"Unimplemented keys" and would ignore them)."""

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def available() -> bool:
    """llguidance is installed."""
    return llguidance is not None


class _Vocabulary:
    """llguidance's view of a model's vocabulary, and the text of its special tokens."""

    def __init__(self, model: LlamaModel) -> None:
        assert llguidance is not None
        eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
        with warnings.catch_warnings():  # it calls llama-cpp-python's deprecated spellings
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(
                model.vocab, n_vocab=model.n_vocab, eos_token=eog or None
            )
        self.n_vocab = model.n_vocab
        self.special: dict[str, int] = {}
        for token in range(model.n_vocab):
            if self.tokenizer.is_special_token(token):
                text = model.token_bytes(token, special=True).decode("utf-8", "replace")
                if text:
                    self.special.setdefault(text, token)


_VOCABULARIES: weakref.WeakKeyDictionary[LlamaModel, _Vocabulary] = weakref.WeakKeyDictionary()


def _vocabulary(model: LlamaModel) -> _Vocabulary:
    found = _VOCABULARIES.get(model)
    if found is None:
        found = _VOCABULARIES[model] = _Vocabulary(model)
    return found


def _json_rule(schema: Mapping[str, Any]) -> str:
    spec = {**schema, "x-guidance": JSON_OPTIONS}
    return f"%json {json.dumps(spec, ensure_ascii=False)}"


def _text(text: str, special: Mapping[str, int]) -> str:
    """``text`` as Lark: quoted literals, and each special token's text as that token."""
    parts: list[str] = []
    rest = text
    while rest:
        hits = [(rest.find(s), -len(s), s) for s in special if s and s in rest]
        if not hits:
            parts.append(json.dumps(rest, ensure_ascii=False))
            break
        at, _, found = min(hits)
        if at:
            parts.append(json.dumps(rest[:at], ensure_ascii=False))
        parts.append(f"<[{special[found]}]>")
        rest = rest[at + len(found) :]
    return " ".join(parts)


def _calls(
    syntax: CallSyntax,
    tools: Sequence[Tool],
    fields: Sequence[str],
    parallel: bool,
    special: Mapping[str, int],
) -> list[str]:
    rules = []
    alternatives = []
    for i, tool in enumerate(tools):
        field = fields[i] if i < len(fields) else f"tools[{i}].function.parameters"
        schema = enforceable(tool.parameters or {"type": "object"}, field, REFUSED)
        rules.append(f"args_{i}: {_json_rule(schema)}")
        head = _text(f"{syntax.head}{tool.name}{syntax.middle}", special)
        tail = f" {_text(syntax.tail, special)}" if syntax.tail else ""
        alternatives.append(f"{head} args_{i}{tail}")
    rules.append(f"call: {' | '.join(alternatives)}")
    calls = "call"
    if parallel:
        calls = f"call ({_text(syntax.separator, special)} call)*" if syntax.separator else "call+"
    opening = f"{_text(syntax.open, special)} " if syntax.open else ""
    closing = f" {_text(syntax.close, special)}" if syntax.close else ""
    rules.append(f"calls: {opening}{calls}{closing}")
    return rules


def _answer(constraint: OutputConstraint) -> str:
    if constraint.kind == "json_object":
        return f"answer: {_json_rule({'type': 'object'})}"
    return f"answer: {_json_rule(enforceable(constraint.schema, constraint.field, REFUSED))}"


def lark_grammar(constraint: OutputConstraint, special: Mapping[str, int]) -> str:
    """``constraint`` (not ``gbnf``) as one Lark grammar, start rule ``start``."""
    if constraint.kind in ("json_object", "json_schema"):
        return "\n".join(["start: answer", _answer(constraint)])
    if constraint.syntax is None or not constraint.tools:
        raise GrammarError("a tool-call constraint needs a syntax and at least one tool", "tools")
    rules = _calls(constraint.syntax, constraint.tools, constraint.tool_fields, constraint.parallel, special)
    if constraint.answer is None:
        return "\n".join(["start: calls", *rules])
    return "\n".join(["start: answer | calls", _answer(constraint.answer), *rules])


def allowed_ids(words: NDArray[np.int32], n_vocab: int) -> NDArray[np.bool_]:
    """llguidance's bitmask (32 token ids a word, lowest bit first) as one flag per id."""
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n_vocab].astype(bool)


class GuidanceMask:
    """One reply's llguidance matcher: the tokens allowed next, and the drawn token fed."""

    def __init__(self, constraint: OutputConstraint, model: LlamaModel) -> None:
        assert llguidance is not None
        vocab = _vocabulary(model)
        grammar = llguidance.LLMatcher.grammar_from_lark(lark_grammar(constraint, vocab.special))
        self.where = _field(constraint)
        bad, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, vocab.tokenizer)
        if bad or warnings:
            raise GrammarError(
                f"the schema at {self.where} cannot be enforced: {_short(warnings)}", self.where
            )
        self.matcher = llguidance.LLMatcher(vocab.tokenizer, grammar)
        if self.matcher.is_error():
            why = _short([self.matcher.get_error()])
            raise GrammarError(f"the schema at {self.where} cannot be enforced: {why}", self.where)
        self.n_vocab = vocab.n_vocab
        self.accepted = 0  # tokens of the reply so far
        self._words = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)

    def allowed(self) -> NDArray[np.bool_]:
        """Raises ``GrammarError`` when no token may come next: the schema dead-ends (said in
        a few words about the schema, never llguidance's state, which is its own business)."""
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        allowed = allowed_ids(self._words, self.n_vocab)
        if self.matcher.is_error() or not allowed.any():
            raise GrammarError(
                f"the schema at {self.where} allows no complete value: no token may follow the "
                f"{self.accepted} of the reply so far (a reference to itself, or a recursion "
                "that never ends?)",
                self.where,
            )
        return allowed

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise GrammarError(
                f"the schema at {self.where} refused token {token} after {self.accepted} of the reply",
                self.where,
            )
        self.accepted += 1


def _short(problems: Sequence[str]) -> str:
    """llguidance's first problem in a line: what it says of the schema, without its place in
    the grammar or the grammar itself (bmoe's wording of the request, not the client's)."""
    line = (problems[0] if problems else "").strip().splitlines()[:1]
    text = line[0] if line else "invalid"
    for lead in ("failed to compile JSON schema: ", "failed to compile JSON schema:"):
        if lead in text:
            text = text.split(lead, 1)[1]
    return text if len(text) <= 200 else f"{text[:200]}..."


def _field(constraint: OutputConstraint) -> str:
    """Where in the request ``constraint``'s schema came from (the error's ``param``)."""
    if constraint.kind == "json_schema":
        return constraint.field
    if constraint.kind == "tool_calls":
        return "tools"
    return "response_format"
