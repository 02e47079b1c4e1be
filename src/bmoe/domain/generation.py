"""What a generate request asks for, and what it returns."""

from __future__ import annotations

from typing import Literal

import attrs

from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.drafting.draft_gate import DraftReport
from bmoe.domain.media.images import MEDIA_MARKER, Image, count_markers
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamCounters, StreamReport
from bmoe.domain.tools.values import ToolCall, ToolUse
from bmoe.errors import ConfigError

TOP_LOGPROBS_MAX = 20


@attrs.frozen
class GenerateRequest:
    """One prompt to answer.

    - ``prompt``: in chat mode the new user message (the session renders the chat template
      over the whole conversation); in raw mode the text fed as is.
    - ``n_predict`` / ``think``: None means the session's default.
    - ``clear_kv``: True starts a new conversation (KV and history dropped, expert cache
      kept); False continues the engine-held conversation, reusing the KV prefix.
    - ``conversation``: the name of the engine-held conversation this request belongs to
      (``None``: the default one). A session holds several by name: switching to another
      parks the current one's history (and, with a prompt cache, its state), so a Python
      app holding several chats continues each where it left it.

    - ``constraint``: a grammar the reply must follow (``None``: free).
    - ``tools`` (chat mode): tools the model may call; the reply is read for calls
      (``RunResult.tool_calls``) and a forced choice is enforced with a grammar.
    - ``role`` / ``tool_call_id``: the prompt is a user message, or (``tool``) the result
      of the call ``tool_call_id``, which the model then answers.
    - ``logprobs``: ``None``, or report each generated token's log-probability and that
      many alternatives (0 to 20) in ``RunResult.logprobs``.
    - ``draft``: False turns copy drafts off for this request (where the session drafts).
    - ``images``: the pictures the prompt places, one per media marker
      (``bmoe.domain.media.MEDIA_MARKER``, ``<__media__>``), in order; they need a vision
      encoder (``SessionConfig.mmproj``).

    Generation stops after ``n_predict`` tokens or at an end-of-generation token, which is
    not part of the result.
    """

    prompt: str
    n_predict: int | None = None
    think: bool | None = None
    clear_kv: bool = True
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    constraint: OutputConstraint | None = None
    tools: ToolUse | None = None
    role: Literal["user", "tool"] = "user"
    tool_call_id: str = ""
    logprobs: int | None = None
    conversation: str | None = None
    draft: bool = True
    images: tuple[Image, ...] = ()

    def __attrs_post_init__(self) -> None:
        if not self.prompt and self.role == "user":
            raise ConfigError("empty prompt")
        if self.images and count_markers(self.prompt) != len(self.images):
            raise ConfigError(
                f"the prompt places {count_markers(self.prompt)} images ({MEDIA_MARKER}) "
                f"but the request carries {len(self.images)}",
                "images",
            )
        if self.n_predict is not None and self.n_predict < 0:
            raise ConfigError(f"n_predict must be >= 0, not {self.n_predict}")
        if self.logprobs is not None and not 0 <= self.logprobs <= TOP_LOGPROBS_MAX:
            raise ConfigError(f"logprobs must be in [0, {TOP_LOGPROBS_MAX}], not {self.logprobs}")


@attrs.frozen
class TokenChoice:
    """A token, the bytes it stands for and its log-probability."""

    token: int
    text: bytes
    logprob: float

    @property
    def piece(self) -> str:
        """``text`` as a string (a byte that is not UTF-8 on its own as U+FFFD)."""
        return self.text.decode("utf-8", errors="replace")


@attrs.frozen
class TokenLogprob:
    """One generated token's log-probability under the model (log-softmax of the logits
    it was drawn from, before biases, penalties, temperature or grammar: the figure a
    decision computes), and the ``top`` most likely tokens there, most likely first."""

    chosen: TokenChoice
    top: tuple[TokenChoice, ...] = ()


@attrs.frozen
class Progress:
    """One decoded token's worth of news (``BMOE_PROGRESS``)."""

    step: int
    steps: int
    wall_ms: float
    delta_text: str
    delta_reasoning: str
    stream: StreamCounters | None = None  # streaming activity since the previous token
    logprob: TokenLogprob | None = None  # when the request asked for log-probabilities
    drafts: DraftReport | None = None  # copy drafts so far in the request (None: not drafted)


@attrs.frozen
class RunResult:
    """The outcome of one generate (``BMOE_DONE``). Times in seconds.

    ``tokens`` are the generated ids (the end-of-generation token excluded); ``text`` the
    answer and ``reasoning`` the thinking span, parsed apart; ``n_prompt`` the tokens
    prefilled this turn (after prefix reuse: the context's own KV, or a state the prompt
    cache restored, ``n_restored`` tokens); ``n_past`` the context length after the turn.
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
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the reply made (a request with tools)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per generated token, when asked for
    n_restored: int = 0  # of the prompt's tokens not prefilled, those the prompt cache held
    drafts: DraftReport | None = None  # what copy drafts did (None: the request was not drafted)

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
