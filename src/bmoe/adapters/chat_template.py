"""Render a model's Jinja chat template (``tokenizer.chat_template``) over messages.

Uses Jinja2's immutable sandbox with the settings Hugging Face and llama-cpp-python use
(``trim_blocks``, ``lstrip_blocks``), so a template renders the same text here as there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import jinja2
import jinja2.sandbox

from bmoe.domain.chat import ChatMessage
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


def _raise(message: str) -> NoReturn:
    raise ConfigError(f"chat template error: {message}")


class JinjaChatTemplate(IChatRenderer):
    """A compiled chat template."""

    def __init__(self, source: str | None) -> None:
        self.source = source or CHATML_TEMPLATE
        self.builtin = source is None
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True
        )
        env.globals["raise_exception"] = _raise
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the model's chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> str:
        """The prompt text for ``messages`` (specials as text, tokenized with parsing on)."""
        try:
            return self._template.render(
                messages=[m.as_template_dict() for m in messages],
                add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking,
                bos_token="",
                eos_token="<|im_end|>",
            )
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the model's chat template failed to render: {exc}") from exc
