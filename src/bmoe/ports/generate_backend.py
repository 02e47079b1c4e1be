"""``IGenerateBackend`` and ``IChatRenderer``: what a session needs from an engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.generation import TokenLogprob
from bmoe.domain.media import Image
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.tools import ToolFormat, ToolUse


class IGenerateBackend(Protocol):
    """A model with one sequence of context, a tokenizer and a sampler.

    Policy (what to keep, when to stop, what fits, cancel, timing) lives in
    ``bmoe.service``; the backend only does what it is told.
    """

    @property
    def n_ctx(self) -> int:
        """Context length fixed at creation, in tokens."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens parsed, with exactly one leading BOS when
        the model wants one (``domain.chat.with_one_bos``). Raises ``TokenizeError``."""
        ...

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        """``tokenize`` for a prompt that places ``images`` (one ``MEDIA_MARKER`` each, in
        order): each image a run of row ids (``domain.media.image_rows``) that ``feed``
        decodes as the image. Raises ``ImageError`` where the model has no vision encoder
        or a picture cannot be read."""
        ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """Bytes of one token as text (control tokens render as nothing unless ``special``)."""
        ...

    def is_eog(self, token: int) -> bool:
        """True for an end-of-generation token."""
        ...

    def reset(self) -> None:
        """Forget the whole context (the next ``feed`` starts at position 0)."""
        ...

    def keep_prefix(self, n_keep: int) -> bool:
        """Remove every position from ``n_keep`` on and keep the rest.

        False when the memory cannot keep a partial prefix (recurrent/hybrid state, or a
        sliding window that already dropped cells the prefix needs): the caller then
        ``reset()``s and prefills the whole prompt. Never raises for that reason.
        """
        ...

    def save_state(self) -> StateBlob | None:
        """A copy of the whole context's state (recurrent layers included), or None when
        the engine copies nothing. Never changes the context."""
        ...

    def load_state(self, blob: StateBlob) -> bool:
        """Replace the context with a state ``save_state`` made (bit for bit); False, and an
        empty context, when the engine refuses it."""
        ...

    def feed(self, tokens: Sequence[int], start_pos: int) -> None:
        """Compute ``tokens`` at ``start_pos...`` into the context, logits for the last one.

        Raises ``DecodeAbortedError`` when ``abort()`` stopped it, another ``DecodeError``
        when it failed; either way the positions it was computing are in an unknown state.
        """
        ...

    def feed_rows(self, tokens: Sequence[int], start_pos: int) -> npt.NDArray[np.float32]:
        """``feed`` in one batch, returning the logits of every token fed (``[n, n_vocab]``):
        a copy draft's verify. Raises as ``feed`` does."""
        ...

    def start_sampling(self, params: SamplingParams, constraint: OutputConstraint | None = None) -> None:
        """Begin a new generation: a fresh sampler (fresh seed state) with ``params``, and
        llama.cpp's grammar sampler when ``constraint`` is set. Raises ``GrammarError``
        (and keeps no sampler) when the constraint cannot become a grammar."""
        ...

    def sample(self) -> int:
        """Choose the next token from the last logits (and let the sampler accept it)."""
        ...

    def token_logprob(self, token: int, top: int) -> TokenLogprob:
        """``token``'s log-probability under the last logits (their log-softmax over the
        whole vocabulary) and the ``top`` most likely tokens, most likely first."""
        ...

    def abort(self) -> None:
        """Make the running (or next) ``feed`` stop early. Safe from any thread."""
        ...

    def clear_abort(self) -> None:
        """Let ``feed`` run again after an ``abort()``."""
        ...


class IChatRenderer(Protocol):
    """A model's chat template."""

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: ToolUse | None = None,
    ) -> str:
        """Prompt text for ``messages``, showing ``tools`` when they are active (through the
        template, or for a ``generic`` one in the system message). Raises ``ConfigError``
        when the template fails."""
        ...

    @property
    def tool_format(self) -> ToolFormat | None:
        """The syntax the template writes calls in (``None``: one bmoe does not read)."""
        ...
