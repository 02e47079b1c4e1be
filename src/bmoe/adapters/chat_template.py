"""Render a model's Jinja chat template (``tokenizer.chat_template``) over messages.

The renderer *is* llama-cpp-python's ``Jinja2ChatFormatter`` (the version bmoe pins): the
same sandbox and settings (``trim_blocks``, ``lstrip_blocks``), the same extensions
(``loopcontrols``, a pass-through ``{% generation %}``), the same ``tojson`` and
``strftime_now``, and the model's own BOS and EOS token texts. So every template renders
here exactly as it renders there (a test compares them on the real templates in llama.cpp's
source), gpt-oss's and Mistral's included.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from bmoe.domain.chat import ChatMessage
from bmoe.domain.tools import Tool, ToolFormat, ToolUse, detect_format
from bmoe.domain.tools.prompting import template_messages
from bmoe.errors import ConfigError
from bmoe.ports.generate_backend import IChatRenderer

# Used when a model carries no template: plain ChatML with Qwen3's handling of thinking.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


class JinjaChatTemplate(IChatRenderer):
    """A compiled chat template; ``bos_token``/``eos_token`` are the model's token texts."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML_TEMPLATE
        self.builtin = source is None
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._formatters = {
                flag: Jinja2ChatFormatter(
                    self.source, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=flag
                )
                for flag in (True, False)
            }
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the model's chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: ToolUse | None = None,
    ) -> str:
        """The prompt text for ``messages`` (specials as text, tokenized with parsing on),
        showing ``tools`` when they are active (``domain.tools.prompting``)."""
        fmt = self.tool_format if ToolUse.shown(tools) is not None else None
        dicts, template_tools = template_messages(messages, fmt, tools)
        variables: dict[str, object] = {"enable_thinking": enable_thinking}
        if template_tools is not None:
            variables["tools"] = template_tools
        return self.render_dicts(dicts, add_generation_prompt=add_generation_prompt, **variables)

    @functools.cached_property
    def tool_format(self) -> ToolFormat | None:
        """The syntax this template writes tool calls in (``domain.tools.formats``): read
        from its source, and whether it renders a tool at all (it is rendered once with a
        probe tool and once without)."""
        return detect_format(self.source, self._renders_tools())

    def _renders_tools(self) -> bool:
        probe = [{"role": "user", "content": "Hello"}]
        tool = Tool("bmoe_probe_tool", "probe", {"type": "object", "properties": {}}).as_openai()
        try:
            with_tool = self.render_dicts(probe, tools=[tool])
        except ConfigError:
            return False
        try:
            return self.render_dicts(probe) != with_tool
        except ConfigError:  # a template that cannot render without tools (Hermes 3's tool_use)
            return True

    def render_dicts(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = True,
        **variables: object,
    ) -> str:
        """Render OpenAI-style message dicts (tool calls included) with extra template
        variables (``enable_thinking``, ``tools``...). Raises ``ConfigError``."""
        formatter = self._formatters[add_generation_prompt]
        try:
            return formatter(messages=list(messages), **variables).prompt  # type: ignore[arg-type]
        except (jinja2.TemplateError, ValueError, TypeError, KeyError, AttributeError) as exc:
            # ValueError: the template's raise_exception(); the rest: a template that
            # indexes what this conversation does not have
            raise ConfigError(f"the model's chat template failed to render: {exc}") from exc
