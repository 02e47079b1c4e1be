"""``LlamaDecideBackend``: ``IDecideBackend`` over a llama.cpp model and context.

The only adapter of decisions over a live llama.cpp context. A kept state is the whole
sequence (``llama_state_seq_get_data``/``set_data`` on sequence 0), recurrent state
included, so it works on hybrid models whose memory cannot be trimmed back to a prefix.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np
import numpy.typing as npt

from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.adapters.llama.context import LlamaContext
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.vision import no_vision_encoder
from bmoe.domain.chat import ChatMessage
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.media import Image
from bmoe.ports.decide_backend import IDecideBackend

SEQ_ID = 0  # LlamaContext holds one sequence


def _bytes_ptr(blob: npt.NDArray[np.uint8]) -> ctypes._Pointer[ctypes.c_uint8]:
    return blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def save_seq_state(ctx: LlamaContext, seq: int = SEQ_ID) -> StateBlob | None:
    """A read-only copy of sequence ``seq``'s whole state, or None when llama.cpp copies
    nothing."""
    size = int(llama_cpp.llama_state_seq_get_size(ctx.ptr, seq))
    if size <= 0:
        return None
    blob = np.empty(size, dtype=np.uint8)
    written = int(llama_cpp.llama_state_seq_get_data(ctx.ptr, _bytes_ptr(blob), size, seq))
    if written <= 0:
        return None
    blob = blob[:written]
    blob.flags.writeable = False
    return blob


def load_seq_state(ctx: LlamaContext, blob: StateBlob) -> bool:
    """Replace the memory with ``blob``; False (memory emptied) when llama.cpp refuses it.

    ``set_data`` removes the sequence itself before writing; clearing the whole memory
    first also resets where the cache looks for free cells, so the restored cells sit
    where a fresh prefill puts them (gates G18a/b check the result is bit-exact).
    """
    ctx.clear()
    data = np.ascontiguousarray(blob, dtype=np.uint8)
    read = 0
    if data.size:
        read = int(llama_cpp.llama_state_seq_set_data(ctx.ptr, _bytes_ptr(data), data.size, SEQ_ID))
    if read == 0:
        ctx.clear()  # llama.cpp 0.3.36 removes a half-read state itself; the contract must not depend on it
        return False
    return True


def load_into_seq(ctx: LlamaContext, blob: StateBlob, seq: int) -> bool:
    """Put ``blob`` (one sequence's saved state) into sequence ``seq``, the other sequences
    untouched (``set_data`` removes ``seq`` first); False (``seq`` emptied) when refused."""
    data = np.ascontiguousarray(blob, dtype=np.uint8)
    read = 0
    if data.size:
        read = int(llama_cpp.llama_state_seq_set_data(ctx.ptr, _bytes_ptr(data), data.size, seq))
    if read == 0:
        ctx.remove_from(0, seq)
        return False
    return True


class LlamaDecideBackend(IDecideBackend):
    """Borrows a model, a context and the model's chat template; owns nothing.

    Decisions use the context's only sequence: whatever a chat left there is replaced (the
    session decides whether to save and put back its chat state around a decision).
    """

    def __init__(self, model: LlamaModel, ctx: LlamaContext, template: JinjaChatTemplate) -> None:
        self.model = model
        self.ctx = ctx
        self.template = template
        self._has_logits = False  # a prefill ran since the last reset / load

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def render(self, user_message: str) -> str:
        return self.template.render([ChatMessage("user", user_message)], enable_thinking=False)

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        if special:
            return self.model.tokenize_prompt(text)
        return self.model.tokenize(text, add_special=False, parse_special=False)

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        raise no_vision_encoder(images)

    def reset(self) -> None:
        self._has_logits = False
        self.ctx.clear()

    def prefill(self, tokens: Sequence[int], start_pos: int) -> None:
        self._has_logits = False
        self.ctx.decode(tokens, start_pos)
        self._has_logits = True

    def logits(self) -> npt.NDArray[np.float32]:
        if not self._has_logits:  # llama.cpp would hand back the last decode's row, stale
            raise ValueError("no logits: nothing was prefilled since the memory was reset or loaded")
        return self.ctx.logits(-1)

    def save_state(self) -> StateBlob | None:
        return save_seq_state(self.ctx)

    def load_state(self, blob: StateBlob) -> bool:
        self._has_logits = False
        return load_seq_state(self.ctx, blob)
