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
