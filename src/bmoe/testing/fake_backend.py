"""``ScriptedGenerateBackend``: an ``IGenerateBackend`` with no model behind it.

Public so users can test code built on bmoe without a model. Its "model" is a script:
the token that follows a context is a pure function of the tokens in the context, so
the same history always continues the same way, whatever was computed before.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

import numpy as np

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.generation import TokenChoice, TokenLogprob
from bmoe.domain.media import MEDIA_MARKER, Image, image_row_ids
from bmoe.domain.sampling import SamplingParams
from bmoe.errors import DecodeAbortedError, DecodeError, ImageError
from bmoe.ports.generate_backend import IGenerateBackend

EOG = 0
IMAGE_ROWS = 4  # rows of every image in the script

NextToken = Callable[[Sequence[int]], int]


def _default_next(context: Sequence[int]) -> int:
    return (sum(context) * 31 + len(context)) % 200 + 32


class ScriptedGenerateBackend(IGenerateBackend):
    """Text is bytes: token ``t`` (1..255) is the byte ``t``; token 0 ends a generation.

    - ``next_token(context)`` decides what follows the context;
    - ``partial_keep=False`` behaves like recurrent/hybrid memory (``keep_prefix`` refuses
      anything but keeping all or nothing);
    - ``fail_at=n`` makes the n-th ``feed`` raise ``DecodeError`` (a fatal failure);
    - ``on_feed(backend, tokens, pos)`` runs at each feed (e.g. to ``abort()`` from a test).

    ``feeds`` records every ``feed`` call as ``(tokens, start_pos)``; ``resets`` counts resets,
    ``saves`` and ``loads`` the states saved and loaded (a state is the context's tokens);
    ``samplings`` every ``start_sampling`` as ``(params, constraint)``. Its distribution is
    uniform over the 256 tokens (``token_logprob``: ``-log 256``, the top ones by id).
    """

    def __init__(
        self,
        n_ctx: int = 64,
        next_token: NextToken = _default_next,
        *,
        partial_keep: bool = True,
        fail_at: int | None = None,
        on_feed: Callable[[ScriptedGenerateBackend, Sequence[int], int], None] | None = None,
    ) -> None:
        self._n_ctx = n_ctx
        self.next_token = next_token
        self.partial_keep = partial_keep
        self.fail_at = fail_at
        self.on_feed = on_feed
        self.context: list[int] = []
        self.feeds: list[tuple[tuple[int, ...], int]] = []
        self.resets = 0
        self.saves = 0  # save_state calls
        self.loads = 0  # load_state calls
        self.samplings: list[tuple[SamplingParams, OutputConstraint | None]] = []
        self._abort = threading.Event()

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def tokenize(self, text: str) -> list[int]:
        return [b for b in text.encode("utf-8") if b != 0]

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        """Each image is ``IMAGE_ROWS`` rows named by its bytes' digest."""
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) != len(images) + 1:
            raise ImageError(f"the prompt places {len(pieces) - 1} images but {len(images)} were given")
        out = self.tokenize(pieces[0])
        for image, piece in zip(images, pieces[1:], strict=True):
            out += [*image_row_ids(bytes.fromhex(image.digest), IMAGE_ROWS), *self.tokenize(piece)]
        return out

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return bytes([token]) if 0 < token < 256 else b""

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def reset(self) -> None:
        self.context.clear()
        self.resets += 1

    def keep_prefix(self, n_keep: int) -> bool:
        if n_keep not in (0, len(self.context)) and not self.partial_keep:
            return False
        del self.context[n_keep:]
        return True

    def save_state(self) -> StateBlob | None:
        self.saves += 1
        blob = np.array(self.context, dtype=np.uint8)  # tokens are bytes: the state is the context
        blob.flags.writeable = False
        return blob

    def load_state(self, blob: StateBlob) -> bool:
        self.loads += 1
        self.context = [int(t) for t in blob]
        return True

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        self.feeds.append((tuple(tokens), start_pos))
        if self.on_feed is not None:
            self.on_feed(self, tokens, start_pos)
        if self._abort.is_set():
            raise DecodeAbortedError("llama_decode failed: aborted by the abort callback (code 2)", 2)
        if self.fail_at is not None and len(self.feeds) == self.fail_at:
            raise DecodeError("scripted failure", -3)
        if start_pos != len(self.context):
            raise DecodeError(f"fed at position {start_pos}, context holds {len(self.context)}", -1)
        if start_pos + len(tokens) > self._n_ctx:
            raise DecodeError("context full", 1)
        self.context.extend(tokens)

    def feed_rows(self, tokens: Sequence[int], start_pos: int) -> np.ndarray:
        """One row a token: the scripted next token after the context up to it, at 1.0."""
        rows = np.zeros((len(tokens), 256), dtype=np.float32)
        for i in range(len(tokens)):
            rows[i, self.next_token([*self.context[:start_pos], *tokens[: i + 1]])] = 1.0
        self.feed(tokens, start_pos)
        return rows

    def start_sampling(self, params: SamplingParams, constraint: OutputConstraint | None = None) -> None:
        self.samplings.append((params, constraint))

    def sample(self) -> int:
        return self.next_token(self.context)

    def token_logprob(self, token: int, top: int) -> TokenLogprob:
        logp = -math.log(256)

        def choice(t: int) -> TokenChoice:
            return TokenChoice(t, self.token_bytes(t), logp)

        return TokenLogprob(choice(token), tuple(choice(t) for t in range(top)))

    def abort(self) -> None:
        self._abort.set()

    def clear_abort(self) -> None:
        self._abort.clear()
