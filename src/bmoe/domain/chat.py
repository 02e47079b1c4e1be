"""Chat messages, as the chat template sees them."""

from __future__ import annotations

from typing import Literal

import attrs

Role = Literal["system", "user", "assistant"]


@attrs.frozen
class ChatMessage:
    """One turn of a conversation. ``reasoning`` is the assistant's thinking, kept apart."""

    role: Role
    content: str
    reasoning: str = ""

    def as_template_dict(self) -> dict[str, str]:
        """The dict a Jinja chat template iterates over (``role``, ``content``...)."""
        out = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        return out


def with_one_bos(tokens: list[int], bos: int | None, add_bos: bool) -> list[int]:
    """A rendered prompt's tokens as the model must see them: when the model wants a BOS
    (``add_bos``, as ``tokenizer.ggml.add_bos_token`` says) exactly one leads, whether or
    not the chat template wrote ``{{ bos_token }}`` itself (never doubled, never dropped);
    when it does not, the tokens are left as the template made them."""
    if not add_bos or bos is None or bos < 0:
        return tokens
    if tokens and tokens[0] == bos:
        return tokens
    return [bos, *tokens]
