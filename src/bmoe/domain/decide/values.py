"""What a decision asks for, how decisions are configured, and what one returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import attrs

from bmoe.domain.decide.choice_scorer import check_choices
from bmoe.domain.decide.log_softmax import renormalise
from bmoe.domain.decide.prefix_cache import PrefixCacheMode, resolve_prefix_cache
from bmoe.domain.media.images import MEDIA_MARKER, Image, count_markers
from bmoe.domain.streaming import StreamCounters
from bmoe.errors import ConfigError, DecideRefusedError

MIB = 1024 * 1024


def _as_choices(value: Any) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class DecideRequest:
    """One decision: which of ``choices`` would the model answer after the prompt?

    - ``prefix`` + ``suffix`` is the prompt, rendered as one user message with reasoning
      off; the split only says which part is worth keeping a state for (the part repeated
      from one decision to the next). Either may be empty, not both.
    - ``choices``: one or more non-empty strings, each scored by the first token of its
      standalone tokenization (no template, no leading space).
    - ``reuse_prefix``: False prefills this request whole and leaves the kept state alone.
    - ``images``: the pictures ``prefix + suffix`` places, one per media marker, in order
      (the session needs a vision encoder); an image in the prefix is kept with its state.

    Raises ``ChoiceError`` / ``DecideRefusedError`` when built with an unusable list or
    prompt.
    """

    prefix: str = ""
    suffix: str = ""
    choices: tuple[str, ...] = attrs.field(converter=_as_choices)
    reuse_prefix: bool = True
    images: tuple[Image, ...] = ()

    def __attrs_post_init__(self) -> None:
        check_choices(self.choices)
        if not self.prefix and not self.suffix:
            raise DecideRefusedError("empty prompt: prefix and suffix are both empty")
        if self.images and count_markers(self.text) != len(self.images):
            raise DecideRefusedError(
                f"the prompt places {count_markers(self.text)} images ({MEDIA_MARKER}) "
                f"but the request carries {len(self.images)}"
            )

    @property
    def prefix_images(self) -> tuple[Image, ...]:
        """The images the prefix places (the first ones)."""
        return self.images[: count_markers(self.prefix)]

    @property
    def text(self) -> str:
        """The user message: ``prefix + suffix``."""
        return self.prefix + self.suffix


def _at_least_one(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ConfigError(f"{attribute.name} must be at least 1, not {value}")


@attrs.frozen
class DecideConfig:
    """Decisions, fixed when a session opens.

    - ``enabled`` (``--decide``): off by default; a session without it refuses decisions
      (``DecideDisabledError``) and allocates nothing for them.
    - ``prefix_cache`` (``--decide-prefix-cache auto|on|off``) and ``prefix_slots``
      (``--decide-prefix-slots K``): whether to keep the state after a prefix, and how many.
    - ``prefill_device``: the session prefills on a device; ``auto`` then keeps nothing and
      ``on`` is refused here.
    - ``probe`` (``--decide-probe FILE``): append one diagnostic line per decision to this
      file (docs/telemetry.md, "Decide probe"); None (the default) installs nothing.

    An unknown mode, ``prefix_slots < 1``, ``on`` with a prefill device or a probe without
    decisions raise ``ConfigError``.
    """

    enabled: bool = False
    prefix_cache: PrefixCacheMode = "auto"
    prefix_slots: int = attrs.field(default=1, validator=_at_least_one)
    prefill_device: bool = False
    probe: Path | None = None

    def __attrs_post_init__(self) -> None:
        resolve_prefix_cache(self.prefix_cache, prefill_device=self.prefill_device)
        if self.probe is not None and not self.enabled:
            raise ConfigError("--decide-probe needs --decide")

    @property
    def keeps_prefix(self) -> bool:
        """Whether prefix states are kept (``auto`` resolved)."""
        return resolve_prefix_cache(self.prefix_cache, prefill_device=self.prefill_device)


@attrs.frozen
class DecidePlan:
    """A decision's prompt on tokens, checked and split.

    ``tokens`` is the rendered prompt; the state after ``tokens[:n_prefix]`` is the one worth
    keeping (0: none); ``choice_tokens`` are the scored first tokens of the choices.
    """

    tokens: tuple[int, ...]
    n_prefix: int
    choice_tokens: tuple[int, ...]

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.n_prefix < len(self.tokens):
            raise ValueError(f"n_prefix {self.n_prefix} outside [0, {len(self.tokens)})")


class PromptFigures(TypedDict):
    """A decision's prompt counts and times, named as ``BMOE_DECIDE`` and ``/v1/decide``
    both report them (``DecideResult.prompt_figures``)."""

    n_tokens: int
    n_reused: int
    n_prefilled: int
    restore_s: float
    store_s: float
    prefill_s: float
    prefill_tps: float


@attrs.frozen
class DecideResult:
    """The outcome of one decision (``BMOE_DECIDE``). Times in seconds.

    - ``best`` / ``choice_logp``: the choices' first-token log-probabilities over the whole
      vocabulary and the index of the highest (-1 and empty when cancelled).
    - ``n_reused``: tokens restored from a kept state; ``n_prefilled``: tokens computed;
      ``n_stored``: the length of the prefix whose state this decision kept (0: none).
    - ``restore_s``: putting the kept state back; ``store_s``: copying the state after the
      prefix (not part of ``prefill_s``); ``prefill_s``: computing the prompt.
    - ``prefix_state_mib``: what the kept states hold after this decision.
    - ``cancelled``: stopped by a cancel; nothing was stored.
    - ``prefix_plan``: with ``auto`` and a new prefix to keep, which way the piece policy
      went and why (``bmoe.domain.decide.piece_policy``); empty otherwise.
    """

    best: int
    choice_logp: tuple[float, ...]
    n_reused: int
    n_prefilled: int
    n_stored: int = 0
    restore_s: float = 0.0
    store_s: float = 0.0
    prefill_s: float = 0.0
    prefix_state_mib: float = 0.0
    cancelled: bool = False
    stream: StreamCounters | None = None  # expert reads during this decision, when streaming
    prefix_plan: str = ""

    @property
    def n_tokens(self) -> int:
        """The prompt's length: ``n_reused + n_prefilled``."""
        return self.n_reused + self.n_prefilled

    @property
    def prefill_tps(self) -> float:
        return self.n_prefilled / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def choice_p_renorm(self) -> tuple[float, ...]:
        """The choices' probabilities rescaled to sum to 1 over the choices (all 0 when the
        model puts no mass on any)."""
        return tuple(float(p) for p in renormalise(self.choice_logp))

    def prompt_figures(self) -> PromptFigures:
        """The prompt's counts and times, one list for the line protocol's answer and the
        server's, so that the two name them alike."""
        return PromptFigures(
            n_tokens=self.n_tokens,
            n_reused=self.n_reused,
            n_prefilled=self.n_prefilled,
            restore_s=self.restore_s,
            store_s=self.store_s,
            prefill_s=self.prefill_s,
            prefill_tps=self.prefill_tps,
        )
