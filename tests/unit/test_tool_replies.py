"""Reading tool calls out of replies, whole and streamed, for each family; which family
each vendored template is; what a template is given when tools are offered."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.domain.chat import ChatMessage
from bmoe.domain.tools import SYNTAX, ReplyGate, Tool, ToolCall, ToolChoice, ToolFormat, ToolUse, parse_reply
from bmoe.domain.tools.prompting import template_messages
from bmoe.errors import ConfigError

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
ARGS = '{"city": "Paris", "days": 2}'


def ids() -> object:
    counter = itertools.count()
    return lambda: f"id{next(counter)}"


CASES: list[tuple[ToolFormat, str, str, list[tuple[str, str]]]] = [
    (
        ToolFormat.HERMES,
        f'Let me look.\n<tool_call>\n{{"name": "weather", "arguments": {ARGS}}}\n</tool_call>',
        "Let me look.\n",
        [("weather", ARGS)],
    ),
    (
        ToolFormat.HERMES,
        f'<tool_call>\n{{"name": "a", "arguments": {{}}}}\n</tool_call>\n'
        f'<tool_call>\n{{"name": "b", "arguments": {ARGS}}}\n</tool_call>',
        "",
        [("a", "{}"), ("b", ARGS)],
    ),
    (ToolFormat.HERMES, "<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", []),
    (ToolFormat.HERMES, "Just text.", "Just text.", []),
    (
        ToolFormat.GENERIC,
        '<tool_call>{"name": "w", "arguments": "{\\"x\\": 1}"}</tool_call>',
        "",
        [("w", '{"x": 1}')],
    ),
    (
        ToolFormat.MISTRAL,
        f'[TOOL_CALLS][{{"name": "w", "arguments": {ARGS}}}, {{"name": "t", "arguments": {{}}}}]',
        "",
        [("w", ARGS), ("t", "{}")],
    ),
    (
        ToolFormat.MISTRAL_ARGS,
        f"[TOOL_CALLS]weather[ARGS]{ARGS}[TOOL_CALLS]time[ARGS]{{}}",
        "",
        [("weather", ARGS), ("time", "{}")],
    ),
    (ToolFormat.LLAMA3, f'{{"name": "weather", "parameters": {ARGS}}}', "", [("weather", ARGS)]),
    (
        ToolFormat.LLAMA3,
        f'<|python_tag|>{{"name": "weather", "parameters": {ARGS}}}',
        "",
        [("weather", ARGS)],
    ),
    (ToolFormat.LLAMA3, "{curly prose}", "{curly prose}", []),
    (
        ToolFormat.HARMONY,
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
        f"<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{ARGS}",
        "",
        [("weather", ARGS)],
    ),
    (
        ToolFormat.HARMONY,
        "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
        "Hi!",
        [],
    ),
]


def _norm(args: str) -> object:
    return json.loads(args)


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_a_reply_parses_into_content_and_calls(
    fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    reply = parse_reply(fmt, text, new_id=ids())  # type: ignore[arg-type]
    assert reply.content == content
    assert [(c.name, _norm(c.arguments)) for c in reply.calls] == [(n, _norm(a)) for n, a in calls]
    assert [c.id for c in reply.calls] == [f"id{i}" for i in range(len(calls))]


def test_harmony_analysis_is_reasoning() -> None:
    reply = parse_reply(ToolFormat.HARMONY, CASES[-1][1])
    assert (reply.reasoning, reply.content) == ("Hm.", "Hi!")


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_a_streamed_reply_lets_out_only_text_that_is_no_call(
    fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    for size in (1, 2, 5):
        gate = ReplyGate(fmt)
        out = "".join(gate.feed(text[i : i + size]) for i in range(0, len(text), size))
        assert content.startswith(out)  # never a piece of a call, never ahead of the content
        if fmt not in (ToolFormat.HARMONY, ToolFormat.LLAMA3) and not calls:
            assert out + gate.held == text  # a reply with no call is held back only at a marker's prefix
        rest = gate.finish()
        assert out + rest.content == content
        assert [(c.name, _norm(c.arguments)) for c in rest.calls] == [(n, _norm(a)) for n, a in calls]


def test_a_reply_with_parallel_off_keeps_the_first_call() -> None:
    reply = parse_reply(ToolFormat.HERMES, CASES[1][1], parallel=False)
    assert [c.name for c in reply.calls] == ["a"]


@pytest.mark.parametrize("fmt", [f for f in ToolFormat])
def test_what_a_forced_grammar_writes_reads_back_as_the_calls(fmt: ToolFormat) -> None:
    syntax = SYNTAX[fmt]
    written = syntax.write([("weather", ARGS)] + ([("time", "{}")] if syntax.parallel else []))
    reply = parse_reply(fmt, written)
    assert [c.name for c in reply.calls] == ["weather", "time"][: 2 if syntax.parallel else 1]
    assert reply.content == ""


FAMILIES = {
    ToolFormat.HERMES: [
        "Qwen-Qwen3-0.6B",
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen-QwQ-32B",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    ],
    ToolFormat.HARMONY: ["openai-gpt-oss-120b"],
    ToolFormat.MISTRAL: ["mistralai-Mistral-Nemo-Instruct-2407"],
    ToolFormat.MISTRAL_ARGS: ["Mistral-Small-3.2-24B-Instruct-2506", "unsloth-mistral-Devstral-Small-2507"],
    ToolFormat.LLAMA3: ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.3-70B-Instruct"],
    ToolFormat.GENERIC: ["google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct"],
    None: [
        "Qwen3-Coder",
        "GLM-4.6",
        "CohereForAI-c4ai-command-r-plus-tool_use",
        "meetkai-functionary-medium-v3.2",
        "deepseek-ai-DeepSeek-V3.2",
        "Kimi-K2-Instruct",
        "MiniMax-M3",
    ],
}


@pytest.mark.parametrize(("fmt", "name"), [(f, n) for f, names in FAMILIES.items() for n in names])
def test_each_vendored_template_is_read_in_its_family(fmt: ToolFormat | None, name: str) -> None:
    template = JinjaChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), bos_token="<s>", eos_token="</s>")
    assert template.tool_format is fmt


WEATHER = Tool("weather", "The weather", {"type": "object", "properties": {"city": {"type": "string"}}})
USE = ToolUse((WEATHER,))
CALLED = ChatMessage("assistant", "", tool_calls=(ToolCall("abcdefghi", "weather", '{"city": "Paris"}'),))
HISTORY = [ChatMessage("user", "Weather?"), CALLED, ChatMessage("tool", "sunny", tool_call_id="abcdefghi")]


@pytest.mark.parametrize(
    "name",
    [
        "Qwen-Qwen3-0.6B",
        "mistralai-Mistral-Nemo-Instruct-2407",
        "meta-llama-Llama-3.1-8B-Instruct",
        "openai-gpt-oss-120b",
    ],
)
def test_a_native_template_renders_the_tools_the_calls_and_the_result(name: str) -> None:
    template = JinjaChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), bos_token="<s>", eos_token="</s>")
    text = template.render(HISTORY, tools=USE)
    assert "The weather" in text and "Paris" in text and "sunny" in text


def test_a_generic_template_gets_the_tools_in_its_system_message_and_calls_as_blocks() -> None:
    dicts, tools = template_messages(HISTORY, ToolFormat.GENERIC, USE)
    assert tools is None
    assert dicts[0]["role"] == "system" and '"name": "weather"' in dicts[0]["content"]
    assert "<tool_call>" in dicts[2]["content"] and "tool_calls" not in dicts[2]
    text = JinjaChatTemplate(None).render(HISTORY, tools=USE)
    assert "<tool_call>" in text and "sunny" in text


def test_tool_values_refuse_what_cannot_be() -> None:
    with pytest.raises(ConfigError, match="not among the tools"):
        ToolUse((WEATHER,), ToolChoice("function", "nope"))
    with pytest.raises(ConfigError, match="same name"):
        ToolUse((WEATHER, WEATHER))
    with pytest.raises(ConfigError, match="needs at least one tool"):
        ToolUse((), ToolChoice("required"))
    assert not ToolUse((WEATHER,), ToolChoice("none")).active


CUT: list[tuple[ToolFormat, str, str, tuple[str, str] | None]] = [
    (
        ToolFormat.HERMES,
        'Hi <tool_call>\n{"name": "weather", "arguments": {"city": "Pa',
        "Hi ",
        ("weather", '{"city": "Pa'),
    ),
    (ToolFormat.HERMES, 'Hi <tool_call>\n{"name": "weat', "Hi ", ("weat", "")),
    (ToolFormat.HERMES, "Hi <tool_c", "Hi <tool_c", None),  # no marker yet: plain text
    (ToolFormat.HERMES, "Hi <tool_call>\n{", "Hi ", None),  # cut before the name: dropped
    (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "weather", "arguments": {"ci', "", ("weather", '{"ci')),
    (ToolFormat.MISTRAL_ARGS, 'ok[TOOL_CALLS]weather[ARGS]{"city": ', "ok", ("weather", '{"city": ')),
    (ToolFormat.LLAMA3, '{"name": "weather", "parameters": {"city"', "", ("weather", '{"city"')),
    (
        ToolFormat.HARMONY,
        '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city',
        "",
        ("weather", '{"city'),
    ),
]


@pytest.mark.parametrize(("fmt", "text", "content", "call"), CUT)
def test_a_call_cut_short_is_a_partial_call_and_never_markup_in_the_content(
    fmt: ToolFormat, text: str, content: str, call: tuple[str, str] | None
) -> None:
    reply = parse_reply(fmt, text, new_id=ids(), cut=True)  # type: ignore[arg-type]
    assert reply.content == content
    assert [(c.name, c.arguments) for c in reply.calls] == ([call] if call else [])
    uncut = parse_reply(fmt, text, new_id=ids())  # type: ignore[arg-type]
    assert not uncut.calls  # without the cut, it is text as before


def test_whole_calls_before_a_cut_one_are_kept() -> None:
    text = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x'
    )
    reply = parse_reply(ToolFormat.HERMES, text, new_id=ids(), cut=True)  # type: ignore[arg-type]
    assert [(c.id, c.name, c.arguments) for c in reply.calls] == [("id0", "a", "{}"), ("id1", "b", '{"x')]
    assert reply.content == ""


def test_call_ids_are_openais_shape_and_templates_see_nine_letters_and_digits() -> None:
    from bmoe.domain.tools.values import new_call_id, template_call_id

    made = new_call_id()
    assert made.startswith("call_") and len(made) == 29 and made[5:].isalnum()
    shown = template_call_id(made)
    assert len(shown) == 9 and shown.isalnum() and shown == template_call_id(made)
    assert template_call_id("abcDEF123") == "abcDEF123"
    message = ChatMessage("assistant", "", tool_calls=(ToolCall(made, "f", "{}"),))
    answer = ChatMessage("tool", "ok", tool_call_id=made)
    assert (
        message.as_template_dict()["tool_calls"][0]["id"]
        == answer.as_template_dict()["tool_call_id"]
        == shown
    )
