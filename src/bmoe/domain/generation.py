"""What a generation asks for and what it returns."""

from __future__ import annotations

import attrs

from bmoe.domain.sampling import SamplingParams
from bmoe.errors import ConfigError


@attrs.frozen
class GenerationRequest:
    """One prompt to complete.

    ``prompt`` is the text fed to the model as is (already rendered through a chat template
    when the caller wants one). At most ``n_predict`` tokens are generated; generation also
    stops at an end-of-generation token, which is not part of the result.
    """

    prompt: str
    n_predict: int = 32
    sampling: SamplingParams = attrs.field(factory=SamplingParams)

    def __attrs_post_init__(self) -> None:
        if not self.prompt:
            raise ConfigError("the prompt is empty")
        if self.n_predict < 0:
            raise ConfigError(f"n_predict must be >= 0, not {self.n_predict}")


@attrs.frozen
class GenerationResult:
    """Tokens and text of one generation, with its timings (seconds)."""

    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    text: str
    prefill_s: float
    decode_s: float
    stopped_at_eog: bool

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_tokens)

    @property
    def prefill_tps(self) -> float:
        return self.n_prompt / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_s_tok(self) -> float:
        """Seconds per generated token (the first token comes from the prefill's logits)."""
        steps = len(self.tokens) - 1
        return self.decode_s / steps if steps > 0 and self.decode_s > 0 else 0.0

    @property
    def tok_s(self) -> float:
        per = self.decode_s_tok
        return 1.0 / per if per > 0 else 0.0
