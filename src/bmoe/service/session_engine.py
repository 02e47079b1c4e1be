"""The session's generate policy: chat history, KV prefix reuse, thinking, cancel.

Runs over the ports only (``IGenerateBackend``, ``IChatRenderer``), so every rule here is
tested against a scripted fake backend; ``bmoe.runtime.Session`` wires it to llama.cpp.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.drafting import DraftPolicy
from bmoe.domain.generation import GenerateRequest, Progress, RunResult, TokenLogprob
from bmoe.domain.kv_reuse import plan_reuse
from bmoe.domain.media import Image, count_markers
from bmoe.domain.prompt_cache import PromptCache, StateTarget
from bmoe.domain.reasoning import Delta, ReasoningSplitter
from bmoe.domain.tools import ToolCall, ToolUse, parse_reply
from bmoe.errors import (
    BmoeError,
    ConfigError,
    ContextOverflowError,
    DecodeAbortedError,
    ImageError,
    SessionFailedError,
    StreamingFaultError,
    ToolFormatError,
    is_fatal,
)
from bmoe.ports.generate_backend import IChatRenderer, IGenerateBackend
from bmoe.service.copy_drafts import Drafting, drafts_for

OnProgress = Callable[[Progress], None]
OnBegin = Callable[[], None]
T = TypeVar("T")


@attrs.frozen
class EngineDefaults:
    """Session-wide settings a request may leave unsaid.

    ``chat``: prompts are user messages rendered through the chat template (else raw text);
    ``draft``: copy drafts' policy (``--draft copy``), None: off.
    """

    chat: bool = False
    think: bool = True
    n_predict: int = 128
    draft: DraftPolicy | None = None


class _Cancelled(Exception):
    pass


@attrs.define
class _Turn:
    """Mutable bookkeeping of one generate."""

    prompt: list[int]
    n_predict: int
    keep: int = 0
    restored: int = 0  # of ``keep``, the tokens a state from the prompt cache held
    tokens: list[int] = attrs.Factory(list)
    text: list[str] = attrs.Factory(list)
    reasoning: list[str] = attrs.Factory(list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stopped_at_eog: bool = False
    logprobs: list[TokenLogprob] = attrs.Factory(list)
    tool_calls: tuple[ToolCall, ...] = ()
    drafting: Drafting | None = None  # copy drafts (service.copy_drafts), None: plain steps


class SessionEngine:
    """One conversation over one backend. ``generate`` calls are serialised; ``cancel`` may
    come from any thread and stops the generate in flight at the next decode boundary."""

    def __init__(
        self,
        backend: IGenerateBackend,
        renderer: IChatRenderer,
        defaults: EngineDefaults | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        """``prompt_cache``: where the context's state is kept when another conversation
        takes the context, and restored from when it comes back (``--cache-ram``)."""
        self.backend = backend
        self.renderer = renderer
        self.defaults = defaults or EngineDefaults()
        self.prompt_cache = prompt_cache
        self.history: list[ChatMessage] = []
        self.kv_tokens: list[int] = []  # the tokens whose state the backend holds, in order
        self.transcript: list[int] = []  # raw mode: prompt and generated tokens so far
        self.conversation: str | None = None  # the name of the conversation held above
        # the other named conversations: (history, transcript) each
        self._parked: dict[str | None, tuple[list[ChatMessage], list[int]]] = {}
        self._lock = threading.Lock()  # one generate at a time
        self._state = threading.Lock()  # guards _running against cancel()
        self._running = False
        self._cancel = threading.Event()
        self._stop = threading.Event()
        self._fatal: BmoeError | None = None
        self._closed = False
        # the last chat prompt rendered for a given conversation: a caller that renders it
        # first (to size n_predict, to count it) does not make generate tokenize it again
        self._last_render: tuple[tuple[object, ...], tuple[int, ...]] | None = None

    # -- control ---------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the generate in flight; ignored when none is (no effect on later ones)."""
        with self._state:
            if self._running:
                self._cancel.set()
                self.backend.abort()

    def stop(self) -> None:
        """Finish the generate in flight after the token being decoded, keeping what it
        generated (a normal result, as when ``n_predict`` is reached; a stop string's
        caller uses it). Ignored when none is; any thread."""
        with self._state:
            if self._running:
                self._stop.set()

    def _set_running(self, running: bool) -> None:
        with self._state:
            self._running = running
            self._cancel.clear()
            self._stop.clear()
            self.backend.clear_abort()

    def fail(self, error: BmoeError) -> None:
        """End the session with a fatal error (sticky)."""
        self._fatal = error

    def close(self, release: Callable[[], None]) -> None:
        """Cancel the request in flight, wait for it to end, then run ``release`` (free the
        backend's resources) with no request running; later requests raise ``ConfigError``.
        Idempotent: ``release`` runs once."""
        self.cancel()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            release()

    def _refuse_if_done(self) -> None:
        """Raise for a closed session or after a fatal error. A streaming fault is raised
        again as itself (the same type and message: which file, which offset), every other
        fatal error as ``SessionFailedError``."""
        if self._closed:
            raise ConfigError("the session is closed")
        if isinstance(self._fatal, StreamingFaultError):
            raise type(self._fatal)(str(self._fatal))
        if self._fatal is not None:
            raise SessionFailedError(f"the session ended after a fatal error: {self._fatal}")

    @property
    def failed(self) -> BmoeError | None:
        """The fatal error that ended the session, if any."""
        return self._fatal

    def render_prompt(
        self,
        request: GenerateRequest,
        *,
        history: Sequence[ChatMessage] | None = None,
        chat: bool | None = None,
    ) -> list[int]:
        """The whole token sequence the context must hold before this turn's answer.

        ``history`` and ``chat`` as in ``generate``. A chat turn with its ``history`` given
        is rendered once: asked again (``n_predict`` aside), the tokens are the last ones."""
        think = self._think(request)
        tools = ToolUse.shown(request.tools)
        if self.defaults.chat if chat is None else chat:
            if tools is not None and self.renderer.tool_format is None:
                raise ToolFormatError(
                    "this model's chat template writes tool calls in a syntax bmoe does not read "
                    "(it reads Hermes/Qwen <tool_call>, gpt-oss channels, Mistral [TOOL_CALLS] "
                    "and Llama 3.x JSON; docs/server.md)"
                )
            key = (
                (attrs.evolve(request, n_predict=None), tuple(history), think)
                if history is not None
                else None
            )
            kept = self._last_render
            if key is not None and kept is not None and kept[0] == key:
                return list(kept[1])
            past = history if history is not None else [] if request.clear_kv else self.history
            messages = [*past, _turn_message(request)]
            text = self.renderer.render(messages, enable_thinking=think, tools=tools)
            tokens = self._tokenize(text, [image for m in messages for image in m.images])
            if key is not None:
                self._last_render = (key, tuple(tokens))
            return tokens
        if history is not None:
            raise ConfigError("a conversation history needs chat mode")
        if tools is not None or request.role != "user":
            raise ConfigError("tools and tool results need chat mode")
        past_tokens = [] if request.clear_kv else self.transcript
        return [*past_tokens, *self._tokenize(request.prompt, request.images)]

    def _tokenize(self, text: str, images: Sequence[Image]) -> list[int]:
        """A prompt's tokens, its images as rows where it places any."""
        if not images:
            return self.backend.tokenize(text)
        if count_markers(text) != len(images):
            raise ImageError(
                f"the chat template placed {count_markers(text)} of the conversation's "
                f"{len(images)} images (it drops images in some messages?)",
                "images",
            )
        return self.backend.tokenize_media(text, images)

    def constraint(self, request: GenerateRequest) -> OutputConstraint | None:
        """The grammar the reply follows: the request's; a forced tool choice's calls (a
        response format waits for the turn after the tools' results, as OpenAI does); with
        tools in ``auto`` beside a JSON response format, either calls or that answer."""
        tools = ToolUse.shown(request.tools)
        if tools is None or (request.constraint is None and not tools.choice.forced):
            return request.constraint
        fmt = self.renderer.tool_format
        if fmt is None:
            raise ToolFormatError(
                "the chat template writes tool calls in a syntax bmoe does not read", "tools"
            )
        if tools.choice.forced:
            return OutputConstraint.tool_calls(fmt, tools)
        if request.constraint is not None and request.constraint.kind == "gbnf":
            raise ConfigError(
                "a GBNF grammar cannot stand beside tools (give a JSON response format)", "grammar"
            )
        return OutputConstraint.tool_calls(fmt, tools, answer=request.constraint)

    def _think(self, request: GenerateRequest) -> bool:
        """A constrained reply starts with its first constrained token: it does not think."""
        if self.constraint(request) is None:
            return self.defaults.think if request.think is None else request.think
        if request.think:
            raise ConfigError(
                "a reply held to a grammar (response format, forced tool) cannot think first",
                "chat_template_kwargs.enable_thinking",
            )
        return False

    # -- generate --------------------------------------------------------------------------

    def generate(
        self,
        request: GenerateRequest,
        on_progress: OnProgress | None = None,
        on_begin: OnBegin | None = None,
        *,
        history: Sequence[ChatMessage] | None = None,
        chat: bool | None = None,
    ) -> RunResult:
        """Answer one request. Raises ``ContextOverflowError`` (session unchanged) when the
        prompt plus ``n_predict`` does not fit, ``SessionFailedError`` after a fatal error.

        ``on_begin`` is called once the request is in flight (from then on ``cancel()``
        acts on it) and before any check or compute; ``on_progress`` once per token.

        ``history`` (chat mode): the conversation before ``request.prompt``, in place of the
        engine-held one, which it replaces (a caller that sends the whole conversation with
        each turn, system prompt included). With ``clear_kv=False`` the context keeps the
        longest token prefix it shares with the memory, whatever the conversation held.
        ``chat``: render this request in chat mode or raw, in place of the session's mode.
        """
        with self._lock:
            self._refuse_if_done()
            self._set_running(True)
            try:
                if on_begin is not None:
                    on_begin()
                return self._generate(request, on_progress, history, chat)
            finally:
                self._set_running(False)

    def run_exclusive(self, work: Callable[[], T], on_begin: OnBegin | None = None) -> T:
        """Run other work on the backend (a decision) as a request in flight: serialised with
        ``generate``, cancellable, refused after a fatal error (a streaming fault during
        the work is one). The work replaces what the
        backend's memory held, so the conversation's KV is forgotten (the next turn
        re-prefills the history it still holds: same tokens, only slower; with a prompt
        cache, its state is kept there first and restored)."""
        with self._lock:
            self._refuse_if_done()
            self._set_running(True)
            try:
                if on_begin is not None:
                    on_begin()
                self._keep_state()
                self.kv_tokens = []
                return work()
            except BaseException as exc:
                if is_fatal(exc):
                    self._fatal = exc
                raise
            finally:
                self._set_running(False)

    def _generate(
        self,
        request: GenerateRequest,
        on_progress: OnProgress | None,
        history: Sequence[ChatMessage] | None,
        chat: bool | None,
    ) -> RunResult:
        self._switch(request.conversation)
        n_predict = self.defaults.n_predict if request.n_predict is None else request.n_predict
        chat = self.defaults.chat if chat is None else chat
        prompt = self.render_prompt(request, history=history, chat=chat)
        if not prompt:
            raise ContextOverflowError("the prompt tokenizes to nothing")
        need = len(prompt) + n_predict
        if need > self.backend.n_ctx:
            raise ContextOverflowError(
                f"prompt ({len(prompt)} tokens) + n_predict ({n_predict}) = {need} "
                f"exceeds the context of {self.backend.n_ctx} tokens"
            )
        # before anything changes: a grammar that does not compile refuses the request here
        constraint = self.constraint(request)
        self.backend.start_sampling(request.sampling, constraint)
        turn = _Turn(prompt=prompt, n_predict=n_predict)
        if self.defaults.draft is not None and drafts_for(request, constraint is not None):
            turn.drafting = Drafting(prompt, self.defaults.draft)
        if request.clear_kv:
            self.history = []
            self.transcript = []
        if history is not None:
            self.history = list(history)
        try:
            self._prefill(turn, request.clear_kv)
            self._decode(turn, on_progress, request)
        except (_Cancelled, DecodeAbortedError):
            self._roll_back(turn)
            return self._result(turn, cancelled=True)
        except BaseException as exc:  # fatal (sticky) or this request's end only: is_fatal
            if is_fatal(exc):
                self._fatal = exc
            else:
                self._roll_back(turn)  # as a cancel: the session answers as a fresh one would
            raise
        self.transcript = [*turn.prompt, *turn.tokens]
        tools = ToolUse.shown(request.tools) if chat else None
        if tools is not None and self.renderer.tool_format is not None:
            cut = not turn.stopped_at_eog and len(turn.tokens) >= turn.n_predict
            reply = parse_reply(
                self.renderer.tool_format, "".join(turn.text), parallel=tools.parallel, cut=cut
            )
            turn.text, turn.tool_calls = [reply.content], reply.calls
            turn.reasoning.append(reply.reasoning)
        if chat:
            answer = ChatMessage("assistant", "".join(turn.text), "".join(turn.reasoning), turn.tool_calls)
            self.history += [_turn_message(request), answer]
        return self._result(turn, cancelled=False)

    def _prefill(self, turn: _Turn, clear: bool) -> None:
        keep = 0 if clear else plan_reuse(self.kv_tokens, turn.prompt).keep
        cache = self.prompt_cache
        found = None if cache is None or clear else cache.lookup(turn.prompt, better_than=keep)
        if keep < len(self.kv_tokens):
            self._keep_state()  # the context is about to lose tokens: its state goes to the cache
        if found is not None and cache is not None:  # the conversation came back
            target = StateTarget(self.backend.load_state, self.backend.keep_prefix, self.backend.reset)
            done = cache.restore(found, turn.prompt, target)
            keep = turn.restored = done.shared if done is not None else 0  # 0: the context is empty
        elif keep == 0 or (keep < len(self.kv_tokens) and not self.backend.keep_prefix(keep)):
            self.backend.reset()  # nothing reusable (or the memory holds other work): start empty
            keep = 0
        turn.keep = keep
        self.kv_tokens = turn.prompt[:keep]
        t0 = time.perf_counter()
        self.backend.feed(turn.prompt[keep:], keep)
        turn.prefill_s = time.perf_counter() - t0
        self.kv_tokens = list(turn.prompt)

    def _switch(self, name: str | None) -> None:
        """Make ``name`` the conversation held: the current one's history is parked (its KV
        stays in the context until another prompt needs it, then goes to the prompt cache
        where there is one)."""
        if name == self.conversation:
            return
        self._parked[self.conversation] = (self.history, self.transcript)
        self.history, self.transcript = self._parked.pop(name, ([], []))
        self.conversation = name

    def conversations(self) -> list[str | None]:
        """The names of the conversations held (the current one first)."""
        return [self.conversation, *self._parked]

    def keep_context_state(self) -> None:
        """Save what the context holds in the prompt cache now: from ``close``'s
        ``release`` (no request running), so that a disk tier writes it for the next
        session."""
        self._keep_state()

    def _keep_state(self) -> None:
        """Save the context's state in the prompt cache (if there is one, and the state is
        not kept already) before the context loses tokens."""
        cache = self.prompt_cache
        if cache is None or not self.kv_tokens or cache.holds(self.kv_tokens):
            return
        blob = self.backend.save_state()
        if blob is not None:
            cache.store(self.kv_tokens, blob)

    def _decode(self, turn: _Turn, on_progress: OnProgress | None, request: GenerateRequest) -> None:
        specials = ToolUse.shown(request.tools) is not None  # call syntaxes use control tokens
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        splitter = ReasoningSplitter()
        t_start = t_tok = time.perf_counter()
        drafting = turn.drafting
        try:
            while len(turn.tokens) < turn.n_predict and not self._stop.is_set():
                if self._cancel.is_set():
                    raise _Cancelled
                token = (
                    self.backend.sample() if drafting is None else drafting.next_token(self.backend.sample)
                )
                if self.backend.is_eog(token):
                    turn.stopped_at_eog = True
                    break
                turn.tokens.append(token)
                logprob = None
                if request.logprobs is not None:
                    logprob = self.backend.token_logprob(token, request.logprobs)
                    turn.logprobs.append(logprob)
                delta = splitter.feed(utf8.decode(self.backend.token_bytes(token, special=specials)))
                self._add(turn, delta)
                if on_progress is not None:
                    now = time.perf_counter()
                    wall_ms, t_tok = (now - t_tok) * 1000.0, now  # since the previous token
                    on_progress(
                        Progress(
                            step=len(turn.tokens),
                            steps=turn.n_predict,
                            wall_ms=wall_ms,
                            delta_text=delta.text,
                            delta_reasoning=delta.reasoning,
                            logprob=logprob,
                            drafts=None if drafting is None else attrs.evolve(drafting.report),
                        )
                    )
                if len(turn.tokens) < turn.n_predict and not self._stop.is_set():
                    if drafting is not None:  # alone or with a draft, unless a verify fed it
                        drafting.emitted(token)
                        drafting.feed(
                            self.backend, token, self.kv_tokens, turn.n_predict - len(turn.tokens) - 1
                        )
                    else:
                        self.backend.feed([token], len(self.kv_tokens))
                        self.kv_tokens.append(token)
            if drafting is not None and turn.tokens:  # the KV as plain steps leave it
                want = len(turn.prompt) + len(turn.tokens) - (0 if turn.stopped_at_eog else 1)
                drafting.settle(self.backend, self.kv_tokens, want)
        finally:
            turn.decode_s = time.perf_counter() - t_start
            self._add(turn, splitter.feed(utf8.decode(b"", final=True)))
            self._add(turn, splitter.finish())

    @staticmethod
    def _add(turn: _Turn, delta: Delta) -> None:
        if delta.text:
            turn.text.append(delta.text)
        if delta.reasoning:
            turn.reasoning.append(delta.reasoning)

    def _roll_back(self, turn: _Turn) -> None:
        """Drop this turn's KV: back to the reused prefix, or to nothing if refused."""
        if self.backend.keep_prefix(turn.keep):
            self.kv_tokens = turn.prompt[: turn.keep]
        else:
            self.backend.reset()
            self.kv_tokens = []
        self.backend.clear_abort()

    def _result(self, turn: _Turn, *, cancelled: bool) -> RunResult:
        return RunResult(
            text="".join(turn.text),
            reasoning="".join(turn.reasoning),
            tokens=tuple(turn.tokens),
            n_prompt=len(turn.prompt) - turn.keep,
            n_restored=turn.restored,
            n_past=len(turn.prompt) + len(turn.tokens) if not cancelled else len(self.kv_tokens),
            prefill_s=turn.prefill_s,
            decode_s=turn.decode_s,
            cancelled=cancelled,
            stopped_at_eog=turn.stopped_at_eog,
            tool_calls=turn.tool_calls,
            logprobs=tuple(turn.logprobs),
            drafts=turn.drafting.report if turn.drafting is not None else None,
        )


def _turn_message(request: GenerateRequest) -> ChatMessage:
    """The message a request adds to the conversation: a user's, or a tool's result."""
    return ChatMessage(request.role, request.prompt, tool_call_id=request.tool_call_id, images=request.images)
