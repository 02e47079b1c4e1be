"""What a generate request asks for, and what it returns."""

from __future__ import annotations

import attrs

from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamCounters, StreamReport
from bmoe.errors import ConfigError


@attrs.frozen
class GenerateRequest:
    """One prompt to answer.

    - ``prompt``: in chat mode the new user message (the session renders the chat template
      over the whole conversation); in raw mode the text fed as is.
    - ``n_predict`` / ``think``: None means the session's default.
    - ``clear_kv``: True starts a new conversation (KV and history dropped, expert cache
      kept); False continues the engine-held conversation, reusing the KV prefix.

    Generation stops after ``n_predict`` tokens or at an end-of-generation token, which is
    not part of the result.
    """

    prompt: str
    n_predict: int | None = None
    think: bool | None = None
    clear_kv: bool = True
    sampling: SamplingParams = attrs.field(factory=SamplingParams)

    def __attrs_post_init__(self) -> None:
        if not self.prompt:
            raise ConfigError("empty prompt")
        if self.n_predict is not None and self.n_predict < 0:
            raise ConfigError(f"n_predict must be >= 0, not {self.n_predict}")


@attrs.frozen
class Progress:
    """One decoded token's worth of news (``BMOE_PROGRESS``)."""

    step: int
    steps: int
    wall_ms: float
    delta_text: str
    delta_reasoning: str
    stream: StreamCounters | None = None  # streaming activity since the previous token


@attrs.frozen
class RunResult:
    """The outcome of one generate (``BMOE_DONE``). Times in seconds.

    ``tokens`` are the generated ids (the end-of-generation token excluded); ``text`` the
    answer and ``reasoning`` the thinking span, parsed apart; ``n_prompt`` the tokens
    prefilled this turn (after prefix reuse); ``n_past`` the context length after the turn.
    """

    text: str
    reasoning: str
    tokens: tuple[int, ...]
    n_prompt: int
    n_past: int
    prefill_s: float
    decode_s: float
    cancelled: bool = False
    stopped_at_eog: bool = False
    stream: StreamReport | None = None  # None when the session does not stream experts

    @property
    def prefill_tps(self) -> float:
        return self.n_prompt / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_s_tok(self) -> float:
        """Seconds per generated token (decode steps only: the first token comes from the
        prefill's logits)."""
        steps = len(self.tokens) - 1
        return self.decode_s / steps if steps > 0 and self.decode_s > 0 else 0.0

    @property
    def tok_s(self) -> float:
        per = self.decode_s_tok
        return 1.0 / per if per > 0 else 0.0
