"""Chat messages, as the chat template sees them."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from bmoe.domain.media.images import Image
from bmoe.domain.tools.values import ToolCall, template_call_id

Role = Literal["system", "user", "assistant", "tool"]


@attrs.frozen
class ChatMessage:
    """One turn of a conversation. ``reasoning`` is the assistant's thinking, kept apart;
    ``tool_calls`` the calls an assistant turn made; ``tool_call_id`` the call a ``tool``
    message answers. ``images``: the pictures ``content`` places, one per media marker
    (``bmoe.domain.media.MEDIA_MARKER``), in order."""

    role: Role
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    images: tuple[Image, ...] = ()

    def as_template_dict(self) -> dict[str, Any]:
        """The dict a Jinja chat template iterates over (``role``, ``content``...). Calls
        carry their arguments as an object, the form every vendored template renders
        (``tool_call.arguments | tojson``; Qwen's take a string as well). Call ids are
        shown as ``template_call_id`` writes them (9 letters and digits, Mistral's rule)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [_template_call(c) for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = template_call_id(self.tool_call_id)
        return out


def _template_call(call: ToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": call.arguments_object()}
    return {"id": template_call_id(call.id), "type": "function", "function": function}


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
