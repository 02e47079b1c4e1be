"""``VisionGenerateBackend``: ``IGenerateBackend`` for a model with a vision encoder.

A prompt's images are runs of row ids (``domain.media.image_rows``); this backend feeds
text runs as tokens and image runs as the encoder's embeddings, through the same context,
at the positions the sequence's ``PositionLedger`` gives (M-RoPE images take fewer
positions than rows). The ledger follows the memory: cut with it, cleared with it, and
saved with its state (after the state's bytes, so a state from the prompt cache, in memory
or on disk, comes back with its images' positions).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.generate_backend import LlamaGenerateBackend
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.vision import VisionEncoder
from bmoe.cext.abort_flag import AbortFlag
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.media import Image, is_image_row
from bmoe.domain.media.positions import PositionLedger

_MAGIC = b"bmoe-img"
_TRAILER = struct.Struct("<8sQ")  # magic, the ledger's bytes (which come before it)


class VisionGenerateBackend(LlamaGenerateBackend):
    """Borrows ``encoder`` (the session closes it) as it borrows the model and context."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, flag: AbortFlag, encoder: VisionEncoder) -> None:
        super().__init__(model, ctx, flag)
        self.encoder = encoder
        self.ledger = PositionLedger()

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        return self.encoder.tokenize(text, images).tokens

    def reset(self) -> None:
        super().reset()
        self.ledger.clear()

    def keep_prefix(self, n_keep: int) -> bool:
        if self.ledger.splits_image(n_keep):
            return False  # an image's rows share their first position: none can be kept alone
        kept = super().keep_prefix(self.ledger.position(n_keep))
        self.ledger.cut(n_keep)
        return kept

    def save_state(self) -> StateBlob | None:
        blob = super().save_state()
        if blob is None or not self.ledger.images:
            return blob
        ledger = self.ledger.to_bytes()
        tail = np.frombuffer(ledger + _TRAILER.pack(_MAGIC, len(ledger)), dtype=np.uint8)
        out = np.concatenate([blob, tail])
        out.flags.writeable = False
        return out

    def load_state(self, blob: StateBlob) -> bool:
        self.ledger.clear()
        data = np.asarray(blob, dtype=np.uint8)
        if data.size >= _TRAILER.size:
            magic, n = _TRAILER.unpack(data[-_TRAILER.size :].tobytes())
            if magic == _MAGIC and n + _TRAILER.size <= data.size:
                end = data.size - _TRAILER.size
                ledger = PositionLedger.from_bytes(data[end - n : end].tobytes())
                if not super().load_state(data[: end - n]):
                    return False
                self.ledger = ledger
                return True
        return super().load_state(data)

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        if not self.ledger.images and not any(is_image_row(t) for t in tokens):
            super().feed(tokens, start_pos)  # text only: positions are indices
            return
        i = 0
        while i < len(tokens):
            if not is_image_row(tokens[i]):
                j = i
                while j < len(tokens) and not is_image_row(tokens[j]):
                    j += 1
                # an image follows: no logits here (nor the last layer's experts for these rows)
                last: Literal["last", "none"] = "last" if j == len(tokens) else "none"
                self.ctx.decode(tokens[i:j], self.ledger.position(start_pos + i), logits=last)
                i = j
                continue
            rows = self.encoder.rows_at(tokens, i)
            embeddings = self.encoder.embeddings(rows.key)  # before the ledger changes
            pos_0 = self.ledger.add(start_pos + i, rows)
            self.ctx.decode_embeddings(
                embeddings,
                self.encoder.positions(rows.key, pos_0),
                last_logits=i + rows.n_tokens == len(tokens),
                causal=not self.encoder.non_causal(rows.key),
            )
            i += rows.n_tokens

    def feed_rows(self, tokens: Sequence[int], start_pos: int) -> npt.NDArray[np.float32]:
        return super().feed_rows(tokens, self.ledger.position(start_pos))
