"""``ScriptedGenerateBackend``: an ``IGenerateBackend`` with no model behind it.

Public so users can test code built on bmoe without a model. Its "model" is a script:
the token that follows a given context is a pure function of the tokens in the context,
so the same history always continues the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bmoe.errors import DecodeError

EOG = 0


def _default_next(context: Sequence[int]) -> int:
    return (sum(context) * 31 + len(context)) % 200 + 1


class ScriptedGenerateBackend:
    """Text is bytes: token ``t`` (1..255) is the byte ``t``; token 0 ends a generation.

    ``next_token(context)`` decides what follows; ``fail_at`` makes the n-th ``feed`` call
    raise ``DecodeError`` (to test error paths). ``feeds`` records every ``feed`` call.
    """

    def __init__(
        self,
        n_ctx: int = 64,
        next_token: Callable[[Sequence[int]], int] = _default_next,
        fail_at: int | None = None,
    ) -> None:
        self._n_ctx = n_ctx
        self.next_token = next_token
        self.fail_at = fail_at
        self.context: list[int] = []
        self.feeds: list[tuple[tuple[int, ...], int]] = []
        self.resets = 0

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def tokenize(self, text: str) -> list[int]:
        return [b for b in text.encode("utf-8") if b != 0]

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if 0 < token < 256 else b""

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def reset(self) -> None:
        self.context.clear()
        self.resets += 1

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        self.feeds.append((tuple(tokens), start_pos))
        if self.fail_at is not None and len(self.feeds) == self.fail_at:
            raise DecodeError("scripted failure", -3)
        if start_pos != len(self.context):
            raise DecodeError(f"fed at position {start_pos}, context holds {len(self.context)}", -1)
        if start_pos + len(tokens) > self._n_ctx:
            raise DecodeError("context full", 1)
        self.context.extend(tokens)

    def sample(self) -> int:
        return self.next_token(self.context)
