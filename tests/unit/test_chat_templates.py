"""bmoe renders real chat templates exactly as llama-cpp-python does, and a prompt gets
exactly one leading BOS when the model wants one.

The templates are llama.cpp's collection of real ones (``tests/data/chat_templates``). For
each, a fixed conversation (system + user; a multi-turn chat; thinking on and off; a tool
call where the template knows tools) is rendered by bmoe's ``JinjaChatTemplate`` and by
llama-cpp-python 0.3.36's ``Jinja2ChatFormatter`` with the same BOS/EOS texts: wherever
llama-cpp-python renders, bmoe must render the same text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.domain.chat import ChatMessage, with_one_bos
from bmoe.errors import ConfigError

TEMPLATES = sorted((Path(__file__).parent.parent / "data" / "chat_templates").glob("*.jinja"))
IDS = [t.stem for t in TEMPLATES]


def special_tokens(name: str) -> tuple[str, str]:
    """BOS and EOS texts of the family a template belongs to (what its GGUF would carry)."""
    lowered = name.lower()
    if "llama-3" in lowered or "hermes-3" in lowered or "firefunction" in lowered or "llama-8b" in lowered:
        return "<|begin_of_text|>", "<|eot_id|>"
    if "gemma" in lowered:
        return "<bos>", "<eos>"
    if "gpt-oss" in lowered:
        return "<|startoftext|>", "<|return|>"
    if "qwen" in lowered or "smollm" in lowered:
        return "", "<|im_end|>"
    return "<s>", "</s>"


SYSTEM_USER = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "What is 2 + 2?"),
]
MULTI_TURN = [
    *SYSTEM_USER,
    ChatMessage("assistant", "4."),
    ChatMessage("user", "And 3 + 3?"),
]
NO_SYSTEM = MULTI_TURN[1:]  # for templates that refuse a system message (Gemma 2)
CONVERSATIONS = (SYSTEM_USER, MULTI_TURN, NO_SYSTEM)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CALL: list[dict[str, Any]] = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'},
]


def llama_cpp_python(
    source: str, bos: str, eos: str, messages: list[dict[str, Any]], **kw: Any
) -> str | None:
    """What llama-cpp-python renders, or None when it cannot render this conversation."""
    try:
        return Jinja2ChatFormatter(source, eos_token=eos, bos_token=bos)(messages=messages, **kw).prompt  # type: ignore[arg-type]
    except Exception:
        return None


@pytest.mark.parametrize("path", TEMPLATES, ids=IDS)
def test_bmoe_renders_every_real_template_as_llama_cpp_python_does(path: Path) -> None:
    source = path.read_text()
    bos, eos = special_tokens(path.stem)
    ours = JinjaChatTemplate(source, bos_token=bos, eos_token=eos)
    compared = 0
    for conversation in CONVERSATIONS:
        for thinking in (True, False):
            theirs = llama_cpp_python(
                source, bos, eos, [m.as_template_dict() for m in conversation], enable_thinking=thinking
            )
            if theirs is None:
                with pytest.raises(ConfigError):
                    ours.render(conversation, enable_thinking=thinking)
                continue
            assert ours.render(conversation, enable_thinking=thinking) == theirs
            compared += 1
    if "tool" in source:
        for conversation in CONVERSATIONS:  # templates that iterate over ``tools`` unguarded
            dicts = [m.as_template_dict() for m in conversation]
            theirs = llama_cpp_python(source, bos, eos, dicts, tools=TOOLS)
            if theirs is not None:
                assert ours.render_dicts(dicts, tools=TOOLS) == theirs
                compared += 1
        theirs = llama_cpp_python(source, bos, eos, TOOL_CALL, tools=TOOLS)
        if theirs is not None:
            assert ours.render_dicts(TOOL_CALL, tools=TOOLS) == theirs
            compared += 1
    assert compared > 0 or path.stem in CANNOT_RENDER, f"{path.stem}: llama-cpp-python renders nothing"


# Templates llama-cpp-python 0.3.36 itself renders for none of these conversations (they
# need inputs llama.cpp's own C++ renderer provides: Cohere's tool_use wants old-style tool
# descriptions, firefunction a ``functions`` string, others fail inside the template).
CANNOT_RENDER = {
    "ByteDance-Seed-OSS",
    "CohereForAI-c4ai-command-r-plus-tool_use",
    "fireworks-ai-llama-3-firefunction-v2",
    "Kimi-K3",
    "llama-cpp-rwkv-world",
    "mistralai-Ministral-3-14B-Reasoning-2512",
    "unsloth-mistral-Devstral-Small-2507",
}


def test_the_templates_a_new_user_could_not_render_before_now_render() -> None:
    """gpt-oss (``strftime_now``), Mistral Small 3.2 and Solar (same), ``{% break %}`` and
    ``{% generation %}`` templates: they failed with bmoe's own Jinja environment."""
    for name in ["openai-gpt-oss-120b", "Mistral-Small-3.2-24B-Instruct-2506", "upstage-Solar-Open-100B"]:
        source = (TEMPLATES[0].parent / f"{name}.jinja").read_text()
        text = JinjaChatTemplate(source, bos_token="<s>", eos_token="</s>").render(SYSTEM_USER)
        assert "What is 2 + 2?" in text


def fake_tokenize(text: str, bos_text: str) -> list[int]:
    """BOS text -> id 1, every other character -> an id above 1 (a stand-in tokenizer)."""
    tokens: list[int] = []
    for part in re.split(f"({re.escape(bos_text)})", text) if bos_text else [text]:
        tokens += [1] if part == bos_text and bos_text else [ord(c) + 2 for c in part]
    return tokens


WRITES_BOS = [t for t in TEMPLATES if "bos_token" in t.read_text()]


@pytest.mark.parametrize("path", WRITES_BOS, ids=[t.stem for t in WRITES_BOS])
def test_a_template_that_writes_bos_gets_no_second_one(path: Path) -> None:
    bos, eos = special_tokens(path.stem)
    bos = bos or "<s>"
    try:
        text = JinjaChatTemplate(path.read_text(), bos_token=bos, eos_token=eos).render(SYSTEM_USER)
    except ConfigError:
        pytest.skip("llama-cpp-python cannot render it either (see CANNOT_RENDER)")
    tokens = with_one_bos(fake_tokenize(text, bos), 1, add_bos=True)
    assert tokens[0] == 1 and tokens[1] != 1  # exactly one leading BOS
    # a model that does not want BOS keeps what the template wrote (nothing dropped)
    assert with_one_bos(fake_tokenize(text, bos), 1, add_bos=False) == fake_tokenize(text, bos)


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "openai-gpt-oss-120b", "ibm-granite-granite-4.0"])
def test_a_template_that_does_not_write_bos_gets_it_only_when_the_model_wants_it(name: str) -> None:
    source = (TEMPLATES[0].parent / f"{name}.jinja").read_text()
    assert "bos_token" not in source
    text = JinjaChatTemplate(source, bos_token="<s>", eos_token="</s>").render(SYSTEM_USER)
    tokens = fake_tokenize(text, "<s>")
    assert 1 not in tokens
    assert with_one_bos(tokens, 1, add_bos=True) == [1, *tokens]
    assert with_one_bos(tokens, 1, add_bos=False) == tokens
    assert with_one_bos(tokens, None, add_bos=True) == tokens  # a vocabulary without BOS


def test_a_template_error_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="does not compile"):
        JinjaChatTemplate("{% for %}")
    template = JinjaChatTemplate("{{ raise_exception('no system role') }}")
    with pytest.raises(ConfigError, match="no system role"):
        template.render(SYSTEM_USER)
