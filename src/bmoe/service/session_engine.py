"""The session's generate policy: chat history, KV prefix reuse, thinking, cancel.

Runs over the ports only (``IGenerateBackend``, ``IChatRenderer``), so every rule here is
tested against a scripted fake backend; ``bmoe.runtime.Session`` wires it to llama.cpp.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs

from bmoe.domain.chat import ChatMessage
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.drafting import DraftPolicy
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.domain.kv_reuse import plan_reuse
from bmoe.domain.prompt_cache import PromptCache, StateTarget
from bmoe.domain.tools import ToolUse, parse_reply
from bmoe.errors import (
    BmoeError,
    ConfigError,
    ContextOverflowError,
    DecodeAbortedError,
    SessionFailedError,
    StreamingFaultError,
    is_fatal,
)
from bmoe.ports.generate_backend import IChatRenderer, IGenerateBackend
from bmoe.service import turn_prompts
from bmoe.service.copy_drafts import Drafting, drafts_for
from bmoe.service.turn_decode import OnProgress, Turn, TurnCancelled, decode, turn_result
from bmoe.service.turn_prompts import turn_message

__all__ = ["EngineDefaults", "OnBegin", "OnProgress", "SessionEngine"]

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
        think = turn_prompts.thinks(self.renderer, request, self.defaults.think)
        if self.defaults.chat if chat is None else chat:
            key = (
                (attrs.evolve(request, n_predict=None), tuple(history), think)
                if history is not None
                else None
            )
            kept = self._last_render
            if key is not None and kept is not None and kept[0] == key:
                return list(kept[1])
            past = history if history is not None else [] if request.clear_kv else self.history
            tokens = turn_prompts.chat_tokens(self.backend, self.renderer, request, past, think=think)
            if key is not None:
                self._last_render = (key, tuple(tokens))
            return tokens
        if history is not None:
            raise ConfigError("a conversation history needs chat mode")
        return turn_prompts.raw_tokens(self.backend, request, [] if request.clear_kv else self.transcript)

    def constraint(self, request: GenerateRequest) -> OutputConstraint | None:
        """The grammar the reply follows (``turn_prompts.constraint``)."""
        return turn_prompts.constraint(self.renderer, request)

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
        turn = Turn(prompt=prompt, n_predict=n_predict)
        if self.defaults.draft is not None and drafts_for(request, constraint is not None):
            turn.drafting = Drafting(prompt, self.defaults.draft)
        if request.clear_kv:
            self.history = []
            self.transcript = []
        if history is not None:
            self.history = list(history)
        try:
            self._prefill(turn, request.clear_kv)
            decode(
                self.backend, turn, self.kv_tokens, request, on_progress, cancel=self._cancel, stop=self._stop
            )
        except (TurnCancelled, DecodeAbortedError):
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
            self.history += [turn_message(request), answer]
        return self._result(turn, cancelled=False)

    def _prefill(self, turn: Turn, clear: bool) -> None:
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

    def _roll_back(self, turn: Turn) -> None:
        """Drop this turn's KV: back to the reused prefix, or to nothing if refused."""
        if self.backend.keep_prefix(turn.keep):
            self.kv_tokens = turn.prompt[: turn.keep]
        else:
            self.backend.reset()
            self.kv_tokens = []
        self.backend.clear_abort()

    def _result(self, turn: Turn, *, cancelled: bool) -> RunResult:
        return turn_result(turn, held=len(self.kv_tokens), cancelled=cancelled)
