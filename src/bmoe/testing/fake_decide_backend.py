"""``ScriptedDecideBackend``: an ``IDecideBackend`` with no model behind it.

Public so users can test code that makes decisions (an agent, a router) without a model.
Its "model" is a pure function of the memory, the token sequence it holds: the same
tokens always give the same logits, however they got there (prefilled whole, in pieces,
or restored from a saved state), which is exactly what a correct decision policy must
preserve.

Text is bytes: token ``b`` (0..255) is the byte ``b``; ``merges`` adds multi-byte tokens
(ids 256...) matched greedily, longest first, so a merge can span the prefix/suffix join
as a BPE merge does; with ``bos`` a BOS token (the last id) opens every prompt.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.media import Image
from bmoe.errors import ConfigError, ContextOverflowError, DecodeAbortedError, DecodeError, ImageError
from bmoe.ports.decide_backend import IDecideBackend

Logits = npt.NDArray[np.float32]
LogitsFn = Callable[[Sequence[int]], Logits]
"""The model: logits of the next token after a token sequence."""


def chat_turn(user_message: str) -> str:
    """The fake's chat template: ``<u>MESSAGE</u><a>`` (reasoning off)."""
    return f"<u>{user_message}</u><a>"


class ScriptedDecideBackend(IDecideBackend):
    """A scripted model, tokenizer and template, with faults to inject.

    - ``logits_fn(tokens)``: the logits after ``tokens``; by default seeded noise from the
      tokens, and with ``answer(prompt_text) -> str`` the first token of that answer gets
      ``answer_boost`` more (an agent's scripted "right answer");
    - ``state_pad``: bytes added to every saved state (a recurrent state's fixed size);
    - faults: ``fail_prefill=n`` / ``abort_prefill=n`` make the n-th ``prefill`` call (from
      1) raise ``DecodeError`` / ``DecodeAbortedError`` after computing part of its tokens;
      ``fail_save`` makes ``save_state`` return None; ``fail_load`` makes ``load_state``
      refuse. They are plain attributes, so a test can flip them between decisions.

    ``calls`` records what was done: ``("reset",)``, ``("prefill", start, n)``,
    ``("save", n_tokens)``, ``("load", n_tokens)``, ``("logits", n_tokens)``.
    """

    def __init__(
        self,
        n_ctx: int = 256,
        logits_fn: LogitsFn | None = None,
        *,
        merges: Sequence[str] = (),
        bos: bool = False,
        answer: Callable[[str], str] | None = None,
        answer_boost: float = 12.0,
        state_pad: int = 0,
        template: Callable[[str], str] = chat_turn,
    ) -> None:
        if any(len(m.encode()) < 2 for m in merges):
            raise ValueError("a merge joins at least two bytes")
        self._n_ctx = n_ctx
        self._merges = {m.encode(): 256 + i for i, m in enumerate(merges)}
        self._pieces = {i: m for m, i in self._merges.items()}
        self.bos_id: int | None = 256 + len(merges) if bos else None
        self.n_vocab = 256 + len(merges) + (1 if bos else 0)
        self._logits_fn = logits_fn or self._scripted_logits
        self.answer = answer
        self.answer_boost = answer_boost
        self.state_pad = state_pad
        self.template = template
        self.memory: list[int] = []
        self.calls: list[tuple[object, ...]] = []
        self.fail_prefill: int | None = None
        self.abort_prefill: int | None = None
        self.fail_save = False
        self.fail_load = False
        self.n_prefill_calls = 0
        self._has_logits = False

    # -- the scripted model ----------------------------------------------------------------

    def noise(self, tokens: Sequence[int]) -> Logits:
        """Seeded noise: a pure function of ``tokens``."""
        seed = zlib.crc32(np.asarray(tokens, dtype="<i8").tobytes())
        return (np.random.default_rng(seed).standard_normal(self.n_vocab) * 3.0).astype(np.float32)

    def _scripted_logits(self, tokens: Sequence[int]) -> Logits:
        row = self.noise(tokens)
        if self.answer is not None:
            wanted = self.tokenize(self.answer(self.detokenize(tokens)), special=False)
            if wanted:
                row[wanted[0]] += np.float32(self.answer_boost)
        return row

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (BOS renders as nothing)."""
        out = b"".join(self._pieces.get(t, bytes([t]) if t < 256 else b"") for t in tokens)
        return out.decode("utf-8", errors="replace")

    # -- IDecideBackend ----------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def render(self, user_message: str) -> str:
        return self.template(user_message)

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        data = text.encode("utf-8")
        out = [self.bos_id] if special and self.bos_id is not None else []
        longest = max((len(m) for m in self._merges), default=1)
        i = 0
        while i < len(data):
            for n in range(min(longest, len(data) - i), 0, -1):
                piece = data[i : i + n]
                if n == 1 or piece in self._merges:
                    out.append(self._merges.get(piece, piece[0]))
                    i += n
                    break
        return out

    def reset(self) -> None:
        self.calls.append(("reset",))
        self.memory.clear()
        self._has_logits = False

    def tokenize_media(self, text: str, images: Sequence[Image]) -> list[int]:
        raise ImageError("the scripted decide backend has no vision encoder", "images")

    def prefill(self, tokens: Sequence[int], start_pos: int) -> None:
        self.calls.append(("prefill", start_pos, len(tokens)))
        self.n_prefill_calls += 1
        self._has_logits = False
        if not tokens:
            raise ConfigError("prefill needs at least one token")
        if start_pos + len(tokens) > self._n_ctx:
            raise ContextOverflowError(f"{start_pos + len(tokens)} tokens do not fit in {self._n_ctx}")
        if start_pos != len(self.memory):
            raise DecodeError(f"prefill at position {start_pos}, the memory holds {len(self.memory)}", -1)
        if self.n_prefill_calls in (self.fail_prefill, self.abort_prefill):
            self.memory.extend(tokens[: len(tokens) // 2])  # part computed: an unknown state
            if self.n_prefill_calls == self.abort_prefill:
                raise DecodeAbortedError("llama_decode failed: aborted by the abort callback (code 2)", 2)
            raise DecodeError("scripted failure", -3)
        self.memory.extend(tokens)
        self._has_logits = True

    def logits(self) -> Logits:
        self.calls.append(("logits", len(self.memory)))
        if not self._has_logits:
            raise ValueError("no logits: nothing was prefilled since the memory was reset or loaded")
        return self._logits_fn(self.memory).astype(np.float32, copy=True)

    def save_state(self) -> StateBlob | None:
        self.calls.append(("save", len(self.memory)))
        if self.fail_save:
            return None
        body = np.asarray(self.memory, dtype="<i4").view(np.uint8)
        blob = np.concatenate([body, np.zeros(self.state_pad, dtype=np.uint8)])
        blob.flags.writeable = False
        return blob

    def load_state(self, blob: StateBlob) -> bool:
        self.calls.append(("load", (blob.size - self.state_pad) // 4))
        self.memory.clear()
        self._has_logits = False
        body = blob.size - self.state_pad
        if self.fail_load or body < 0 or body % 4:
            return False
        self.memory.extend(int(t) for t in np.asarray(blob[:body]).view("<i4"))
        return True
