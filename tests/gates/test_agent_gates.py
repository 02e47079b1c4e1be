"""Agents' features on the tiny fixtures, through llama.cpp: grammars, tool calls, logprobs.

- A request with none of the new settings samples exactly what the plain chain (the one
  bmoe built before them, written here with llama.cpp's API) samples, greedy and seeded.
- A grammar holds: a JSON schema's replies validate against it, a forced tool choice's
  calls validate against the tool's parameters, even on random weights.
- A token's reported log-probability is the one a decision computes for it (the same
  log-softmax of the same logits).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import jsonschema
import llama_cpp
import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.adapters.llama.sampler import Sampler
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.decide.log_softmax import log_softmax
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.tools import Tool, ToolChoice, ToolUse
from bmoe.errors import GrammarError
from bmoe.runtime import Session, SessionConfig

TinyModelPath = Callable[..., Path]
TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
PROMPT = "The quick brown fox"
N = 24
LESS_THAN = 27  # "<" in the tiny models' byte-level vocabulary (bmoe.tinymodel.tokenizer)
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def _plain_chain(params: SamplingParams) -> llama_cpp.llama_sampler_p:
    """The chain bmoe's sampler built before biases, penalties and grammars existed."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if params.greedy:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(params.temp))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(params.seed))
    return chain


def _run(model: LlamaModel, draw: Callable[[LlamaContext], int]) -> list[int]:
    with LlamaContext(model, ContextParams(n_ctx=256)) as ctx:
        tokens = model.tokenize_prompt(PROMPT)
        ctx.decode(tokens, 0)
        out: list[int] = []
        for _ in range(N):
            token = draw(ctx)
            out.append(token)
            ctx.decode([token], len(tokens) + len(out) - 1)
        return out


@pytest.mark.parametrize(
    "params", [SamplingParams(), SamplingParams(temp=0.8, top_k=40, top_p=0.95, seed=11)]
)
def test_a_request_without_the_new_settings_samples_what_the_plain_chain_samples(
    tiny_model_path: TinyModelPath, fixture_name: str, params: SamplingParams
) -> None:
    with LlamaModel(tiny_model_path(fixture_name)) as model:
        chain = _plain_chain(params)
        try:
            reference = _run(model, lambda ctx: int(llama_cpp.llama_sampler_sample(chain, ctx.ptr, -1)))
        finally:
            llama_cpp.llama_sampler_free(chain)
        with Sampler(params, model, 256) as sampler:
            ours = _run(model, sampler.sample)
    assert ours == reference


def test_penalties_and_logit_bias_draw_what_their_arithmetic_says(
    tiny_model_path: TinyModelPath, fixture_name: str
) -> None:
    """Greedy with llama.cpp's logit-bias and penalties samplers equals greedy over the logits
    plus the bias, less ``count x frequency + (count > 0) x presence`` for each token this
    generation produced, in float32 as llama.cpp computes it."""
    with LlamaModel(tiny_model_path(fixture_name)) as model:
        plain = _run(model, lambda ctx: int(np.argmax(ctx.logits(-1))))
        bias = {plain[-1]: 2.0, plain[0]: -100.0}  # the first token ruled out: the draw must change
        params = SamplingParams(frequency_penalty=1.5, presence_penalty=0.5, logit_bias=bias)
        counts: dict[int, int] = {}

        def reference(ctx: LlamaContext) -> int:
            logits = ctx.logits(-1).astype(np.float32)
            for token, b in bias.items():
                logits[token] += np.float32(b)
            for token, n in counts.items():
                logits[token] -= np.float32(n) * np.float32(1.5) + np.float32(0.5)
            best = int(np.argmax(logits))
            counts[best] = counts.get(best, 0) + 1
            return best

        expected = _run(model, reference)
        with Sampler(params, model, 256) as sampler:
            ours = _run(model, sampler.sample)
    assert expected != plain  # the settings matter on this model
    assert ours == expected


def test_a_repeat_penalty_over_a_window_draws_what_llama_cpps_arithmetic_says(
    tiny_model_path: TinyModelPath, fixture_name: str
) -> None:
    """Greedy with ``repeat_penalty`` (Ollama's option) over the last ``penalty_last_n``
    tokens equals greedy over the logits where each token of that window has its logit
    divided by the penalty when positive, multiplied when not, in float32. A penalty under 1
    (a boost) tells even where the greedy run never repeats a token within the window."""
    penalty, window = 0.2, 8
    with LlamaModel(tiny_model_path(fixture_name)) as model:
        plain = _run(model, lambda ctx: int(np.argmax(ctx.logits(-1))))
        drawn: list[int] = []

        def reference(ctx: LlamaContext) -> int:
            logits = ctx.logits(-1).astype(np.float32)
            for token in set(drawn[-window:]):
                logits[token] = (
                    logits[token] * np.float32(penalty)
                    if logits[token] <= 0
                    else (logits[token] / np.float32(penalty))
                )
            drawn.append(int(np.argmax(logits)))
            return drawn[-1]

        expected = _run(model, reference)
        params = SamplingParams(repeat_penalty=penalty, penalty_last_n=window)
        with Sampler(params, model, 256) as sampler:
            ours = _run(model, sampler.sample)
    assert expected != plain  # the penalty matters on this model
    assert ours == expected


def test_min_p_of_one_keeps_only_the_likeliest_token(
    tiny_model_path: TinyModelPath, fixture_name: str
) -> None:
    """``min_p`` 1.0 keeps only the tokens as likely as the likeliest: a hot seeded draw is
    then greedy, which the same draw without it is not."""
    hot = SamplingParams(temp=1.5, top_k=0, top_p=1.0, seed=3)
    with LlamaModel(tiny_model_path(fixture_name)) as model:
        plain = _run(model, lambda ctx: int(np.argmax(ctx.logits(-1))))
        with Sampler(hot, model, 256) as sampler:
            drawn = _run(model, sampler.sample)
        with Sampler(attrs.evolve(hot, min_p=1.0), model, 256) as sampler:
            kept = _run(model, sampler.sample)
    assert drawn != plain
    assert kept == plain


@pytest.fixture(scope="module")
def qwen_session(tiny_model_path: TinyModelPath) -> Iterator[Session]:
    config = SessionConfig(
        model_path=tiny_model_path("qwen3moe"),
        chat=True,
        context=ContextParams(n_ctx=1024),
        chat_template=(TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(),
    )
    with Session(config) as session:
        yield session


SCHEMAS = [
    WEATHER,
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
        "required": ["ok"],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "array", "optional"])
def test_a_json_schema_reply_validates_against_its_schema(
    qwen_session: Session, schema: dict[str, object]
) -> None:
    for seed in range(3):
        request = GenerateRequest(
            "Answer in JSON.",
            n_predict=200,
            sampling=SamplingParams(temp=1.0, seed=seed),
            constraint=OutputConstraint.json_schema(schema),
        )
        result = qwen_session.generate(request)
        assert result.stopped_at_eog, result.text
        jsonschema.validate(json.loads(result.text), schema)


def test_a_json_object_reply_is_a_json_object(qwen_session: Session) -> None:
    request = GenerateRequest("JSON?", n_predict=300, constraint=OutputConstraint("json_object"))
    result = qwen_session.generate(request)
    if result.stopped_at_eog:  # a free object may run past n_predict on random weights
        assert isinstance(json.loads(result.text), dict)
    assert result.text.startswith("{")


@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("function", "get_weather")])
def test_a_forced_tool_choice_returns_calls_whose_arguments_validate(
    qwen_session: Session, choice: ToolChoice
) -> None:
    tools = (
        Tool("get_time", "the time", {"type": "object", "properties": {}}),
        Tool("get_weather", "", WEATHER),
    )
    use = ToolUse(tools, choice, parallel=False)
    result = qwen_session.generate(GenerateRequest("Weather in Paris?", n_predict=200, tools=use))
    assert result.stopped_at_eog
    assert len(result.tool_calls) == 1
    call = result.tool_calls[0]
    if choice.mode == "function":
        assert call.name == "get_weather"
    schema = WEATHER if call.name == "get_weather" else tools[0].parameters
    jsonschema.validate(json.loads(call.arguments), schema)
    assert result.text == ""  # nothing but the call


@pytest.mark.parametrize("engine", ["llguidance", "converter"])
@pytest.mark.parametrize("branch", ["answer", "call"])
@pytest.mark.parametrize("seed", range(3))
def test_auto_tools_beside_a_json_answer_give_a_valid_call_or_a_valid_answer(
    qwen_session: Session, engine: str, branch: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One grammar, two branches, in either engine: a call whose arguments validate or an
    answer valid against the format. The random weights always open with ``{`` (the
    answer); a bias on ``<`` (the tiny vocabulary spells ``<tool_call>`` from bytes) takes
    the other branch, which the grammar must still hold to a whole, valid call."""
    from bmoe.adapters.llama import guidance

    if engine == "converter":
        monkeypatch.setattr(guidance, "available", lambda: False)
    elif not guidance.available():
        pytest.skip("llguidance is not installed (bmoe[grammar])")
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    use = ToolUse((Tool("get_weather", "", WEATHER),), parallel=False)
    request = GenerateRequest(
        "Weather?",
        n_predict=200,
        tools=use,
        constraint=OutputConstraint.json_schema(answer),
        sampling=SamplingParams(
            temp=1.0, seed=seed, logit_bias=((LESS_THAN, 30.0),) if branch == "call" else ()
        ),
    )
    result = qwen_session.generate(request)
    assert result.stopped_at_eog
    assert bool(result.tool_calls) == (branch == "call")
    if result.tool_calls:
        jsonschema.validate(json.loads(result.tool_calls[0].arguments), WEATHER)
        assert result.text == ""
    else:
        jsonschema.validate(json.loads(result.text), answer)


@pytest.mark.parametrize("engine", ["llguidance", "converter"])
def test_a_schema_the_grammar_cannot_enforce_is_refused_before_any_compute(
    qwen_session: Session, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llguidance refuses ``uniqueItems``; the converter (llguidance absent) refuses the
    numeric bounds too. Both name the keyword's pointer and leave the session as it was."""
    from bmoe.adapters.llama import guidance

    if engine == "converter":
        monkeypatch.setattr(guidance, "available", lambda: False)
    elif not guidance.available():
        pytest.skip("llguidance is not installed (bmoe[grammar])")
    bounded = OutputConstraint.json_schema({"type": "integer", "minimum": 3})
    unique = OutputConstraint.json_schema({"type": "array", "uniqueItems": True})
    with pytest.raises(GrammarError, match="'uniqueItems' at #/uniqueItems") as info:
        qwen_session.generate(GenerateRequest("n?", constraint=unique))
    assert info.value.where == "response_format.json_schema.schema#/uniqueItems"
    if engine == "converter":
        with pytest.raises(GrammarError, match="'minimum' at #/minimum"):
            qwen_session.generate(GenerateRequest("n?", constraint=bounded))
    else:
        text = qwen_session.generate(GenerateRequest("n?", constraint=bounded, n_predict=12)).text
        assert int(text) >= 3
    with pytest.raises(GrammarError, match="could not parse"):
        qwen_session.generate(GenerateRequest("n?", constraint=OutputConstraint.gbnf("root ::= (")))
    assert qwen_session.generate(GenerateRequest("still fine?", n_predict=4)).tokens  # the session goes on


def test_a_tokens_logprob_is_what_a_decision_computes(tiny_model_path: TinyModelPath) -> None:
    config = SessionConfig(
        model_path=tiny_model_path("qwen3moe"), chat=False, context=ContextParams(n_ctx=256)
    )
    with Session(config) as session, LlamaModel(tiny_model_path("qwen3moe")) as model:
        result = session.generate(GenerateRequest(PROMPT, n_predict=6, logprobs=5))
        assert len(result.logprobs) == len(result.tokens)
        with LlamaContext(model, ContextParams(n_ctx=256)) as ctx:  # the same feeds as the session's
            context = model.tokenize_prompt(PROMPT)
            ctx.decode(context, 0)
            rows = [ctx.logits(-1)]
            for i, token in enumerate(result.tokens[:-1]):
                ctx.decode([token], len(context) + i)
                rows.append(ctx.logits(-1))
        for token, row, reported in zip(result.tokens, rows, result.logprobs, strict=True):
            logp = log_softmax(row)
            assert reported.chosen.token == token
            assert reported.chosen.logprob == logp[token]
            assert [t.logprob for t in reported.top] == sorted(logp, reverse=True)[:5]
            assert sum(2.718281828459045**t.logprob for t in reported.top) <= 1.0
