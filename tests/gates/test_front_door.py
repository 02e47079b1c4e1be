"""The front door on the built-in tiny model: ``import bmoe`` as one namespace,
``Session.stream`` / ``astream`` against ``generate`` (the same tokens; leaving the loop
cancels and the session answers the next request as before), and llama-cpp-python's own
README examples run on ``bmoe.Llama`` with only the constructor changed, answered in its
shapes and, greedy, with the tokens ``llama_cpp.Llama`` gives on the same model."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import bmoe
from bmoe.domain.tools import Tool, ToolChoice, ToolUse

COMPLETION_KEYS = {"id", "object", "created", "model", "choices", "usage"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens"}
QUESTION = "Q: Name the planets in the solar system? A: "


@pytest.fixture(scope="module")
def session() -> Iterator[bmoe.Session]:
    config = bmoe.SessionConfig(
        model_path=bmoe.default_model_path(),
        chat=True,
        n_predict=24,
        stream=bmoe.StreamConfig(enabled=True, cache_mb=1),
        context=bmoe.ContextParams(n_ctx=512, n_threads=1),
    )
    with bmoe.Session.open(config) as s:
        yield s


def test_import_bmoe_offers_the_app_s_names_without_loading_llama_cpp() -> None:
    code = "import sys, bmoe; assert 'llama_cpp' not in sys.modules, 'eager'; print(len(bmoe.__all__))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in bmoe.__all__:
        assert getattr(bmoe, name) is not None, name
    assert issubclass(bmoe.ContextOverflowError, bmoe.BmoeError)
    assert bmoe.SessionConfig.from_hf is not None
    with pytest.raises(AttributeError):
        _ = bmoe.NoSuchName  # type: ignore[attr-defined]


def test_the_package_is_typed() -> None:
    from importlib.resources import files

    assert files("bmoe").joinpath("py.typed").is_file()
    assert files("bmoe").joinpath("__init__.pyi").is_file()


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "raw"])
def test_stream_gives_generate_s_tokens_and_text(session: bmoe.Session, chat: bool) -> None:
    request = bmoe.GenerateRequest("Hello there", n_predict=24)
    expected = session.generate(request, chat=chat)
    got = list(session.stream(request, chat=chat))
    result = got[-1].result
    assert result is not None and not result.cancelled
    assert result.tokens == expected.tokens
    assert "".join(p.text for p in got) == expected.text
    assert "".join(p.reasoning for p in got) == expected.reasoning


def test_breaking_out_of_a_stream_cancels_and_the_next_request_is_answered_as_before(
    session: bmoe.Session,
) -> None:
    request = bmoe.GenerateRequest("Tell me a long story", n_predict=400)
    short = bmoe.GenerateRequest("Tell me a long story", n_predict=8)
    before = session.generate(short)
    seen = 0
    for piece in session.stream(request):
        seen += bool(piece.text or piece.reasoning)
        if seen == 2:
            break
    assert session.engine.history == []  # the cancelled turn was rolled back, not kept
    after = session.generate(short)
    assert after.tokens == before.tokens and not after.cancelled


def test_astream_gives_generate_s_tokens_and_a_break_cancels(session: bmoe.Session) -> None:
    request = bmoe.GenerateRequest("Hello there", n_predict=24)
    expected = session.generate(request)

    async def main() -> list[bmoe.Piece]:
        got = [p async for p in session.astream(request)]
        long = bmoe.GenerateRequest("Tell me a long story", n_predict=400)
        async with contextlib.aclosing(session.astream(long)) as pieces:
            async for _ in pieces:
                break
        return got

    got = asyncio.run(main())
    result = got[-1].result
    assert result is not None and result.tokens == expected.tokens
    assert "".join(p.text for p in got) == expected.text
    assert session.engine.history == []
    assert session.generate(request).tokens == expected.tokens


def test_a_forced_tool_call_streams_as_deltas(session: bmoe.Session) -> None:
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = ToolUse((Tool("get_weather", "the weather", city),), ToolChoice("function", "get_weather"))
    got = list(session.stream(bmoe.GenerateRequest("Weather in Paris?", n_predict=60, tools=tools)))
    deltas = [d for p in got for d in p.call_deltas]
    result = got[-1].result
    assert deltas and deltas[0].name == "get_weather"
    assert result is not None and [c.name for c in result.tool_calls] == ["get_weather"]
    assert result.tool_calls[0].id == deltas[0].id
    assert "".join(d.arguments for d in deltas if d.index == 0) == result.tool_calls[0].arguments


# -- llama-cpp-python's README, the constructor changed ------------------------------------


@pytest.fixture(scope="module")
def llm() -> Iterator[bmoe.Llama]:
    # llama-cpp-python's README builds its Llama with a chat format; bmoe uses the model's template
    with bmoe.Llama(
        model_path=str(bmoe.default_model_path()),
        chat_format="chatml",
        n_threads=1,
        verbose=False,
        cache_mb=1,
    ) as llm:
        assert llm.notes[0] == "llama_compat: chat_format is not used by bmoe"
        yield llm


def _shape(answer: Any, obj: str) -> dict[str, Any]:
    assert isinstance(answer, dict)
    assert set(answer) >= COMPLETION_KEYS and answer["object"] == obj
    assert set(answer["usage"]) >= USAGE_KEYS
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert len(answer["choices"]) == 1
    choice: dict[str, Any] = answer["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")
    return choice


def test_the_readme_s_completion(llm: bmoe.Llama) -> None:
    output = llm(QUESTION, max_tokens=32, stop=["Q:", "\n"], echo=True)
    choice = _shape(output, "text_completion")
    assert output["id"].startswith("cmpl-")
    assert choice["text"].startswith(QUESTION)
    assert "\n" not in choice["text"] and "Q:" not in choice["text"][len(QUESTION) :]
    assert output["usage"]["completion_tokens"] <= 32


def test_the_readme_s_chat_completion(llm: bmoe.Llama) -> None:
    answer = llm.create_chat_completion(
        messages=[
            {"role": "system", "content": "You are an assistant who perfectly describes images."},
            {"role": "user", "content": "Describe this image in detail please."},
        ]
    )
    choice = _shape(answer, "chat.completion")
    assert answer["id"].startswith("chatcmpl-")
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)


def test_the_readme_s_json_mode(llm: bmoe.Llama) -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
        {"role": "user", "content": "Who won the world series in 2020"},
    ]
    plain = llm.create_chat_completion(
        messages=messages, response_format={"type": "json_object"}, temperature=0.7
    )
    assert _shape(plain, "chat.completion")["message"]["content"].lstrip().startswith("{")
    schema = {"type": "object", "properties": {"team_name": {"type": "string"}}, "required": ["team_name"]}
    held = llm.create_chat_completion(
        messages=messages, response_format={"type": "json_object", "schema": schema}, temperature=0.7
    )
    assert _shape(held, "chat.completion")["message"]["content"].startswith('{"team_name": "')


def test_the_readme_s_function_calling(llm: bmoe.Llama) -> None:
    answer = llm.create_chat_completion(
        messages=[
            {
                "role": "system",
                "content": "A chat between a curious user and an artificial intelligence assistant. "
                "The assistant gives helpful, detailed, and polite answers to the user's questions. "
                "The assistant calls functions with appropriate input when necessary",
            },
            {"role": "user", "content": "Extract Jason is 25 years old"},
        ],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "UserDetail",
                    "parameters": {
                        "type": "object",
                        "title": "UserDetail",
                        "properties": {
                            "name": {"title": "Name", "type": "string"},
                            "age": {"title": "Age", "type": "integer"},
                        },
                        "required": ["name", "age"],
                    },
                },
            }
        ],
        tool_choice={"type": "function", "function": {"name": "UserDetail"}},
    )
    choice = answer["choices"][0]
    assert choice["finish_reason"] in ("tool_calls", "length")  # random weights: the call may not end
    calls = choice["message"]["tool_calls"]
    assert choice["message"]["content"] is None
    assert [(c["type"], c["function"]["name"]) for c in calls] == [("function", "UserDetail")]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["arguments"].startswith('{"name": "')


def test_log_probabilities_in_llama_cpp_python_s_shapes(llm: bmoe.Llama) -> None:
    text = llm("Hello", max_tokens=3, logprobs=2)["choices"][0]["logprobs"]
    assert len(text["tokens"]) == len(text["token_logprobs"]) == len(text["top_logprobs"]) == 3
    assert text["text_offset"][0] == len("Hello")  # offsets count the prompt, as llama-cpp-python's do
    chat = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Hi"}], max_tokens=2, logprobs=True, top_logprobs=1
    )
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and all(len(t["top_logprobs"]) == 1 for t in content)


def test_streamed_chunks_have_llama_cpp_python_s_shapes(llm: bmoe.Llama) -> None:
    chunks = list(llm(QUESTION, max_tokens=8, stream=True))
    assert all(c["object"] == "text_completion" and len({c["id"] for c in chunks}) == 1 for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    whole = llm(QUESTION, max_tokens=8, temperature=0)
    greedy = list(llm(QUESTION, max_tokens=8, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in greedy) == whole["choices"][0]["text"]

    chat = list(
        llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True)
    )
    assert all(c["object"] == "chat.completion.chunk" for c in chat)
    assert chat[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chat[-1]["choices"][0]["delta"] == {} and chat[-1]["choices"][0]["finish_reason"] is not None
    deltas = [c["choices"][0]["delta"] for c in chat[1:-1]]
    assert all("content" in d or "reasoning_content" in d for d in deltas)


def test_greedy_answers_equal_llama_cpp_python_s_on_the_same_model() -> None:
    """Resident, the file's weight layout: the same tokens as ``llama_cpp.Llama``'s, raw text
    and chat (its chat handler renders the GGUF's template, as bmoe does)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = str(bmoe.default_model_path())
    messages = [{"role": "user", "content": "Hi there"}]
    ref = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=1, verbose=False)
    try:
        want_text = ref(QUESTION, max_tokens=24, stop=["Q:", "\n"], echo=True, temperature=0)
        want_chat = ref.create_chat_completion(messages=messages, max_tokens=12, temperature=0)
        want_tokens = ref.tokenize(QUESTION.encode())
        want_bytes = ref.detokenize(want_tokens)
    finally:
        ref.close()
    with bmoe.Llama(model_path=path, n_threads=1, verbose=False, moe_stream=False, repack=False) as llm:
        got_text = llm(QUESTION, max_tokens=24, stop=["Q:", "\n"], echo=True, temperature=0)
        got_chat = llm.create_chat_completion(messages=messages, max_tokens=12, temperature=0)
        assert llm.tokenize(QUESTION.encode()) == want_tokens
        assert llm.detokenize(want_tokens) == want_bytes
        assert llm.n_ctx() == 512
    assert got_text["choices"][0]["text"] == want_text["choices"][0]["text"]
    for key in USAGE_KEYS:
        assert got_text["usage"][key] == want_text["usage"][key]
        assert got_chat["usage"][key] == want_chat["usage"][key]
    assert got_chat["choices"][0]["message"]["content"] == want_chat["choices"][0]["message"]["content"]
    assert got_chat["choices"][0]["finish_reason"] == want_chat["choices"][0]["finish_reason"]


def test_what_bmoe_cannot_honour_is_refused_not_ignored(llm: bmoe.Llama) -> None:
    with pytest.raises(bmoe.ConfigError, match="repeat_penalty"):
        llm("Hi", repeat_penalty=1.1)
    with pytest.raises(bmoe.ConfigError, match="mirostat_mode"):
        llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], mirostat_mode=2)
    with pytest.raises(bmoe.ConfigError, match="embedding"):
        bmoe.Llama(model_path=str(bmoe.default_model_path()), embedding=True, verbose=False)
    with pytest.raises(TypeError, match="no_such_option"):
        bmoe.Llama(model_path=str(bmoe.default_model_path()), no_such_option=1, verbose=False)
