"""Backends for a model with a vision encoder: ``VisionGenerateBackend`` (one sequence,
``IGenerateBackend``), ``VisionBatchBackend`` (parallel sequences, ``IBatchBackend``) and
``VisionDecideBackend`` (decisions, ``IDecideBackend``).

A prompt's images are runs of row ids (``domain.media.image_rows``); these backends feed
text runs as tokens and image runs as the encoder's embeddings, through the same context,
at the positions each sequence's ``PositionLedger`` gives (M-RoPE images take fewer
positions than rows). A ledger follows its sequence's memory: cut with it, cleared with it,
and saved with its state (after the state's bytes, so a state from the prompt cache, in
memory or on disk, comes back with its images' positions).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.adapters.llama.batch_backend import LlamaBatchBackend
from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.decide_backend import LlamaDecideBackend
from bmoe.adapters.llama.generate_backend import LlamaGenerateBackend
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.vision import VisionEncoder
from bmoe.cext.abort_flag import AbortFlag
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.media import Image, is_image_row
from bmoe.domain.media.positions import PositionLedger

_MAGIC = b"bmoe-img"
_TRAILER = struct.Struct("<8sQ")  # magic, the ledger's bytes (which come before it)


def feed_runs(
    ctx: LlamaContext,
    encoder: VisionEncoder,
    ledger: PositionLedger,
    tokens: Sequence[int],
    start: int,
    seq: int = 0,
) -> None:
    """Feed ``tokens`` from index ``start`` of sequence ``seq``: text runs as tokens, image
    runs as embeddings, at the ledger's positions (which it records); logits for the last."""
    i = 0
    while i < len(tokens):
        if not is_image_row(tokens[i]):
            j = i
            while j < len(tokens) and not is_image_row(tokens[j]):
                j += 1
            # an image follows: no logits here (nor the last layer's experts for these rows)
            last: Literal["last", "none"] = "last" if j == len(tokens) else "none"
            ctx.decode(tokens[i:j], ledger.position(start + i), logits=last, seq=seq)
            i = j
            continue
        rows = encoder.rows_at(tokens, i)
        embeddings = encoder.embeddings(rows.key)  # before the ledger changes
        pos_0 = ledger.add(start + i, rows)
        ctx.decode_embeddings(
            embeddings,
            encoder.positions(rows.key, pos_0),
            last_logits=i + rows.n_tokens == len(tokens),
            causal=not encoder.non_causal(rows.key),
            seq=seq,
        )
        i += rows.n_tokens


def with_ledger(blob: StateBlob | None, ledger: PositionLedger) -> StateBlob | None:
    """A sequence's state with its images' positions after its bytes (as is without images)."""
    if blob is None or not ledger.images:
        return blob
    data = ledger.to_bytes()
    out = np.concatenate([blob, np.frombuffer(data + _TRAILER.pack(_MAGIC, len(data)), dtype=np.uint8)])
    out.flags.writeable = False
    return out


def load_with_ledger(blob: StateBlob, load: Callable[[StateBlob], bool]) -> PositionLedger | None:
    """Load ``with_ledger``'s state through ``load`` (llama.cpp's part); the ledger it was
    saved with (empty for a state saved without images), None where ``load`` refused it."""
    state, ledger = _split_ledger(blob)
    return ledger if load(state) else None


def _split_ledger(blob: StateBlob) -> tuple[StateBlob, PositionLedger]:
    """``with_ledger``'s parts: the state as llama.cpp wrote it, and the ledger (empty for a
    state saved without images)."""
    data = np.asarray(blob, dtype=np.uint8)
    if data.size >= _TRAILER.size:
        magic, n = _TRAILER.unpack(data[-_TRAILER.size :].tobytes())
        if magic == _MAGIC and n + _TRAILER.size <= data.size:
            end = data.size - _TRAILER.size
            return data[: end - n], PositionLedger.from_bytes(data[end - n : end].tobytes())
    return data, PositionLedger()


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
        return with_ledger(super().save_state(), self.ledger)

    def load_state(self, blob: StateBlob) -> bool:
        ledger = load_with_ledger(blob, super().load_state)
        self.ledger = ledger if ledger is not None else PositionLedger()
        return ledger is not None

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        if self.ledger.indexed(tokens):
            super().feed(tokens, start_pos)  # text only: positions are indices
        else:
            feed_runs(self.ctx, self.encoder, self.ledger, tokens, start_pos)

    def feed_rows(self, tokens: Sequence[int], start_pos: int) -> npt.NDArray[np.float32]:
        return super().feed_rows(tokens, self.ledger.position(start_pos))


class VisionBatchBackend(LlamaBatchBackend):
    """``LlamaBatchBackend`` whose sequences may hold images: a prompt with images is
    prefilled alone (``BatchRun`` does not chunk it), the decode steps' positions are each
    sequence's ledger's. ``ledgers`` (one per sequence) outlive the backend: a run's slots
    keep their KV for the next run, on a new backend, and their images' positions with it."""

    def __init__(
        self,
        model: LlamaModel,
        ctx: LlamaContext,
        on_step: Callable[[int], None],
        encoder: VisionEncoder,
        ledgers: list[PositionLedger],
    ) -> None:
        super().__init__(model, ctx, on_step)
        if len(ledgers) != self.n_seq:
            raise ValueError(f"one ledger per sequence: {len(ledgers)} for {self.n_seq}")
        self.encoder = encoder
        self.ledgers = ledgers

    def clear(self) -> None:
        super().clear()
        for ledger in self.ledgers:
            ledger.clear()

    def drop(self, seq: int) -> None:
        super().drop(seq)
        self.ledgers[seq].clear()

    def keep(self, seq: int, n_keep: int) -> bool | None:
        ledger = self.ledgers[seq]
        if ledger.splits_image(n_keep):
            return False
        kept = super().keep(seq, ledger.position(n_keep))
        if kept is not False:
            ledger.cut(n_keep)
        return kept

    def prefill(self, seq: int, tokens: Sequence[int], start_pos: int = 0) -> None:
        if self.ledgers[seq].indexed(tokens):
            super().prefill(seq, tokens, start_pos)
            return
        self.on_step(1)
        feed_runs(self.ctx, self.encoder, self.ledgers[seq], tokens, start_pos, seq)

    def save_state(self, seq: int) -> StateBlob | None:
        return with_ledger(super().save_state(seq), self.ledgers[seq])

    def load_state(self, seq: int, blob: StateBlob) -> bool:
        ledger = load_with_ledger(blob, lambda state: super(VisionBatchBackend, self).load_state(seq, state))
        self.ledgers[seq] = ledger if ledger is not None else PositionLedger()
        return ledger is not None

    def step(
        self,
        entries: Sequence[tuple[int, int, int]],
        outputs: Sequence[bool] | None = None,
        *,
        n_decode: int | None = None,
    ) -> None:
        placed = [(token, self.ledgers[seq].position(index), seq) for token, index, seq in entries]
        super().step(placed, outputs, n_decode=n_decode)


class VisionDecideBackend(LlamaDecideBackend):
    """``LlamaDecideBackend`` whose prompts may place images (a decision's prefix kept with
    its images' positions)."""

    def __init__(
        self, model: LlamaModel, ctx: LlamaContext, template: JinjaChatTemplate, encoder: VisionEncoder
    ) -> None:
        super().__init__(model, ctx, template)
        self.encoder = encoder
        self.ledger = PositionLedger()

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        return self.encoder.tokenize(text, images).tokens

    def reset(self) -> None:
        super().reset()
        self.ledger.clear()

    def prefill(self, tokens: Sequence[int], start_pos: int) -> None:
        if self.ledger.indexed(tokens):
            super().prefill(tokens, start_pos)
            return
        self._has_logits = False
        feed_runs(self.ctx, self.encoder, self.ledger, tokens, start_pos)
        self._has_logits = True

    def save_state(self) -> StateBlob | None:
        return with_ledger(super().save_state(), self.ledger)

    def load_state(self, blob: StateBlob) -> bool:
        ledger = load_with_ledger(blob, super().load_state)
        self.ledger = ledger if ledger is not None else PositionLedger()
        return ledger is not None
