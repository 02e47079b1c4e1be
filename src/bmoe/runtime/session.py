"""``Session``: load a model once, answer many prompts (spec/session.md).

The composition root of a session: it opens the llama.cpp model (``runtime.placement``: where
the weights sit, the AMX choice) and context (with the C abort flag that makes ``cancel()``
work; streamed, ``runtime.session_streaming`` attaches the streamer), and hands them, as
ports, to the policy in ``bmoe.service``: ``session_engine`` (generate), ``parallel_jobs``
(parallel sequences), ``decider``, ``perplexity``. It owns the lifecycle: what was opened is
closed once, in order. ``run()`` in ``bmoe.runtime`` is a thin one-shot wrapper around it,
so both paths are the same machinery.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Unpack

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.adapters import crash_line
from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.adapters.llama import LlamaModel
from bmoe.adapters.llama.log import set_llama_verbose
from bmoe.adapters.model_files import MappedFiles
from bmoe.cext.abort_flag import AbortFlag
from bmoe.domain.chat import ChatMessage
from bmoe.domain.decide import DecideRequest, DecideResult
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.domain.perplexity import PplAccumulator
from bmoe.domain.pieces import Piece
from bmoe.domain.weight_layout import WeightLayout
from bmoe.errors import ConfigError, ModelFileTruncatedError, StreamingFaultError
from bmoe.requests.chat_fields import ChatFields, Messages
from bmoe.requests.neutral import Delta, Outcome
from bmoe.runtime import chat_requests, cpu_choice, pieces, session_streaming, vision
from bmoe.runtime import placement as model_placement
from bmoe.runtime.decisions import SessionDecisions
from bmoe.runtime.engine_defaults import engine_defaults
from bmoe.runtime.governor import CacheGovernor
from bmoe.runtime.placement import LoadChoice
from bmoe.runtime.prompt_states import keep_at_close, open_prompt_cache
from bmoe.runtime.session_config import OnLoad, SessionConfig
from bmoe.runtime.streaming import StreamingControl
from bmoe.runtime.usage_profile import ProfileKeeper
from bmoe.service import perplexity as ppl
from bmoe.service.parallel_jobs import ParallelEntry, ParallelJobs, ParallelSink, Take
from bmoe.service.perplexity import OnWindow, Perplexity
from bmoe.service.session_engine import OnBegin, OnProgress, SessionEngine

# names that moved out of this module, still importable from it
__all__ = ["OnLoad", "OnWindow", "ParallelEntry", "ParallelSink", "Perplexity", "Session", "SessionConfig"]


class Session:
    """A loaded model and its context; ``generate`` runs against that state.

    Use as a context manager, or call ``close()``. ``cancel()``, ``set_cache_budget()`` and
    ``close()`` may be called from any thread.
    """

    def __init__(self, config: SessionConfig, on_load: OnLoad | None = None) -> None:
        """Prefer ``Session.open(config)``."""
        set_llama_verbose(config.verbose)
        crash_line.arm(f"loading {config.model_path.name}")
        t0 = time.perf_counter()
        self.config = config
        self._flag = AbortFlag()
        self.notes: list[str] = []  # lines for the user about how the session runs
        busy = cpu_choice.busy_note(config.context.n_threads)
        if busy is not None:
            self.notes.append(busy)
        self.streaming: StreamingControl | None = None  # _placed: what bmoe placed itself, or None
        self._load = LoadChoice.of(config)
        self.amx = self._load.amx
        self.model = LlamaModel(config.model_path, self._load.model_params(config.n_expert_used, on_load))
        self._mapped = MappedFiles.snapshot(config.model_path)
        self._decisions = SessionDecisions(config.decide, self.model)
        try:
            self.ctx, self.streaming, self._placed = session_streaming.open_context(
                self.model, config, self._flag, self._decisions.hook, self._load, self.notes, on_load
            )
        except BaseException:
            self._decisions.close()
            self.model.close()
            raise
        self.config = attrs.evolve(config, context=self.ctx.params)  # the batch chosen, if it was
        self.template = JinjaChatTemplate(
            config.chat_template or self.model.chat_template,
            bos_token=self.model.bos_text,
            eos_token=self.model.eos_text,
        )
        try:
            self.vision = vision.open_encoder(self.model, config)
        except BaseException:
            if self.streaming is not None:
                self.streaming.close()
            self.ctx.close()
            self._decisions.close()
            self.model.close()
            raise
        self._backend = vision.generate_backend(self.model, self.ctx, self._flag, self.vision)
        if self.streaming is not None:  # a verify's rows: one decode step of that many
            self._backend.on_rows = self.streaming.set_decode_rows
        self.prompt_cache = open_prompt_cache(config, self.notes)
        self.engine = SessionEngine(
            self._backend,
            self.template,
            engine_defaults(self.config, self.model, self.notes),
            self.prompt_cache,
        )
        self._parallel = ParallelJobs(
            self.engine,
            config.n_predict,
            vision.batch_backend(self.model, self.ctx, self.vision),  # not self: no cycle
            config.slot_similarity,
            self.prompt_cache,
            rows=self.streaming,
            after=self._learn,
        )
        self._decisions.attach(self.engine, self.ctx, self.template, self.streaming, self._learn, self.vision)
        # None in a session without decisions (nothing allocated); the gates look
        self._decide_backend, self._prefix_cache = self._decisions.backend, self._decisions.prefix_cache
        self.governor: CacheGovernor | None = None
        if self.streaming is not None and config.stream.governed:
            self.governor = session_streaming.start_governor(
                self.streaming, config.stream, self.prompt_cache, config.cache_ram_mb
            )
        self.profile: ProfileKeeper | None = None
        if self.streaming is not None and config.stream.profile != "off":
            self.profile = session_streaming.open_profile(
                self.streaming, config.stream, self.model.n_expert_used, self.notes
            )
        self.load_s = time.perf_counter() - t0
        self._closed = False
        crash_line.arm(f"running {config.model_path.name}", self.weight_buffer_types)

    def _learn(self) -> None:
        session_streaming.learn(self.profile, self.notes)

    @classmethod
    def open(cls, config: SessionConfig, on_load: OnLoad | None = None) -> Session:
        """Load the model and create the context (once). ``on_load(phase, fraction)``
        follows the loading (llama.cpp's progress, then the streaming setup)."""
        return cls(config, on_load)

    # -- facts -----------------------------------------------------------------------------

    @property
    def arch(self) -> str:
        return self.model.arch

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def n_seq(self) -> int:
        """The sequences the context holds (``ContextParams.n_seq_max``, llama.cpp's ``-np``)."""
        return self.ctx.params.n_seq_max

    @property
    def slot_tokens(self) -> tuple[int, ...] | None:
        """The tokens each parallel slot's KV keeps between runs; None: nothing kept."""
        memory = self._parallel.memory
        return None if memory is None else tuple(len(held) for held in memory.held)

    @property
    def parallel_peak(self) -> int:
        """The most sequences one decode step of parallel sequences held (settable: 0 resets)."""
        return self._parallel.peak

    @parallel_peak.setter
    def parallel_peak(self, n: int) -> None:
        self._parallel.peak = n

    @property
    def parallel_running(self) -> int:
        """The sequences the last step held (0 between runs)."""
        return self._parallel.running

    @property
    def n_expert(self) -> int:
        return self.model.n_expert

    @property
    def n_expert_used(self) -> int:
        return self.model.n_expert_used

    @property
    def placement_line(self) -> str:
        """Where the weights sit, with devices (``placement: -ngl ... (weights: ...)``), or ""."""
        return model_placement.where_line(self.config.placement, self.model.weight_buffers)

    @property
    def weight_layout(self) -> WeightLayout:
        """Which weights compute in llama.cpp's repacked layout (and AMX's refusal, if any)."""
        streamed = self.streaming.info.repack if self.streaming is not None else None
        return self._load.layout(self.model, streamed, self._placed)

    @property
    def weight_buffer_types(self) -> tuple[str, ...]:
        """The buffer types holding the weights (``CPU_Mapped``, ``CPU_REPACK``, ``AMX``...)."""
        return model_placement.buffer_types(self.model, self.weight_layout)

    @property
    def feeding(self) -> tuple[int, int]:
        """``(tokens decoded, tokens to decode)`` of the decode call in flight or the last
        one (a prefill's progress, by ``n_batch`` chunks); any thread."""
        return self.ctx.feeding

    @property
    def think_ctl(self) -> bool:
        """Whether the chat template honours ``enable_thinking``."""
        return "enable_thinking" in self.template.source

    # -- work ------------------------------------------------------------------------------

    def generate(
        self,
        request: GenerateRequest,
        on_progress: OnProgress | None = None,
        on_begin: OnBegin | None = None,
        *,
        history: Sequence[ChatMessage] | None = None,
        chat: bool | None = None,
    ) -> RunResult:
        """Run one request against the loaded state (see ``SessionEngine.generate``:
        ``history`` is the whole conversation before ``request.prompt``, in place of the
        engine-held one; ``chat`` overrides the session's mode for this request). Streamed,
        the result carries the run's ``StreamReport`` and each ``Progress`` its reads."""
        self._refuse_if_faulted()
        self._parallel.memory = None  # the context is the conversation's now
        self._decisions.forget()  # a chat turn drops the kept decision state
        if self.streaming is None:
            return self.engine.generate(request, on_progress, on_begin, history=history, chat=chat)
        result = session_streaming.generate_streamed(
            self.streaming, self.engine, request, on_progress, on_begin, history, chat
        )
        self._learn()
        return result

    def stream(
        self,
        request: GenerateRequest,
        *,
        history: Sequence[ChatMessage] | None = None,
        chat: bool | None = None,
    ) -> Iterator[Piece]:
        """``generate`` as an iterator of ``Piece`` values (text, reasoning, tool-call
        deltas; the last carries the ``RunResult``), the generation on a worker thread;
        leaving the loop early cancels it (``bmoe.runtime.pieces``)."""
        reader = pieces.reader(self.engine, request, chat)
        return pieces.stream(self, reader, request, history=history, chat=chat)

    def astream(
        self,
        request: GenerateRequest,
        *,
        history: Sequence[ChatMessage] | None = None,
        chat: bool | None = None,
    ) -> AsyncIterator[Piece]:
        """``stream`` for asyncio: an async iterator, the event loop never blocked."""
        reader = pieces.reader(self.engine, request, chat)
        return pieces.astream(self, reader, request, history=history, chat=chat)

    def chat(self, messages: Messages, **fields: Unpack[ChatFields]) -> Outcome:
        """A chat turn from OpenAI-shaped ``messages`` and a chat-completions body's fields
        (``tools``, ``response_format``, ``max_tokens``...), read, refused (``RequestError``)
        and mapped as the server reads that body; its ``Outcome`` (``runtime.chat_requests``)."""
        return chat_requests.answer(self, messages, fields)

    def chat_stream(self, messages: Messages, **fields: Unpack[ChatFields]) -> Iterator[Delta | Outcome]:
        """``chat`` as its pieces (``Delta``) as they are final, then its ``Outcome``;
        leaving the loop early cancels it, as ``stream``."""
        return chat_requests.answer_stream(self, messages, fields)

    def generate_batch(
        self, requests: Sequence[GenerateRequest], *, chat: bool | None = None
    ) -> list[RunResult]:
        """Answer ``requests`` as parallel sequences of one context (``ContextParams
        .n_seq_max``, llama.cpp's ``-np``): up to that many at a time, one ``llama_decode``
        per step holding a token of each (continuous batching: a finished one's slot takes
        the next). Each request stands alone (no conversation history; the session's is
        forgotten, as a decision forgets it). With experts streamed, a step reads each
        expert once for all its sequences. The results in the requests' order."""
        self._refuse_parallel()
        return self._parallel.generate_batch(requests, self.config.chat if chat is None else chat)

    def run_parallel(self, take: Take) -> None:
        """Serve requests as they come, as parallel sequences (``generate_batch``'s way):
        ``take(idle)`` is asked before each step for new entries (``idle``: nothing runs or
        waits; an empty answer then ends the run). Each entry's ``sink`` hears its tokens
        (``progress``), is asked after each whether to end it (``wants_stop``), and gets its
        ``RunResult`` (``done``) or the error that refused or ended it (``failed``). The
        slots keep their KV for the next run (``bmoe.service.parallel_jobs``)."""
        self._refuse_parallel()
        self._parallel.run_parallel(take)

    def _refuse_parallel(self) -> None:
        """Before parallel sequences run: refused after a fault or with routing policies;
        the kept decision state is dropped."""
        self._refuse_if_faulted()
        if self.streaming is not None and self.config.stream.routing_policies:
            raise ConfigError("parallel sequences do not combine with decode routing policies yet")
        self._decisions.forget()

    def decide(self, request: DecideRequest, on_begin: OnBegin | None = None) -> DecideResult:
        """Score ``request.choices`` from one prefill (spec/decide.md). Refusals raise
        ``DecideRefusedError`` kinds before anything is computed; the session stays usable."""
        self._refuse_if_faulted()
        self._parallel.memory = None
        return self._decisions.decide(request, on_begin)

    def perplexity(self, text: str) -> Perplexity:
        """Log-probability of each token of ``text`` (as is, specials parsed) given the ones
        before it, from one prefill computing every row (``bmoe.service.perplexity``). Runs
        as a request in flight (the chat's KV is forgotten, as after a decision)."""
        self._refuse_if_faulted()
        self._parallel.memory = None
        return ppl.perplexity(self.engine, self.ctx, self.model.tokenize_prompt, text)

    def perplexity_windows(
        self, text: str, n_ctx: int | None = None, on_window: OnWindow | None = None
    ) -> PplAccumulator:
        """Perplexity of ``text`` as llama.cpp's ``llama-perplexity`` computes it
        (``bmoe.domain.perplexity``): windows of ``n_ctx`` tokens (default: the context length
        the session was opened with), each from an empty memory, BOS first when the model wants it, the second
        half scored. ``on_window(window, accumulator)`` after each window. Raises
        ``ConfigError`` for a text shorter than two windows. Runs as a request in flight."""
        self._refuse_if_faulted()
        self._parallel.memory = None
        n_ctx = n_ctx or self.config.context.n_ctx  # -c as given (llama.cpp may pad the context)
        bos = self.model.bos if self.model.add_bos else None
        return ppl.perplexity_windows(
            self.engine, self.ctx, self.model.tokenize_prompt, text, n_ctx, bos, on_window
        )

    def set_cache_budget(self, budget_mb: int) -> None:
        """Shrink or grow the expert cache (evicts in eviction order). From any thread: during a
        decode it takes effect at the next decode boundary. With the governor running, the
        budget set is its ceiling from then on (it may shrink it under pressure, never grow
        past it)."""
        session_streaming.set_cache_budget(self.streaming, self.governor, budget_mb)

    def cancel(self) -> None:
        """Stop the generate in flight at the next decode boundary (any thread)."""
        self.engine.cancel()

    def stop(self) -> None:
        """Finish the generate in flight after the current token, keeping its result (any
        thread; see ``SessionEngine.stop``)."""
        self.engine.stop()

    def last_logits(self) -> npt.NDArray[np.float32]:
        """The logits of the last token computed (a copy), for gates and oracles."""
        return self.ctx.logits(-1)

    # -- ownership -------------------------------------------------------------------------

    def _refuse_if_faulted(self) -> None:
        """Before any work: refuse a closed session; make a streaming fault that happened
        since the last request (or a model file replaced meanwhile) fatal, and raise it."""
        if self._closed:
            raise ConfigError("the session is closed")
        if self.streaming is not None and self.engine.failed is None:
            try:
                self.streaming.check()
            except StreamingFaultError as exc:
                self.engine.fail(exc)
                raise
        if self.streaming is None and self.engine.failed is None:
            why = self._mapped.truncated()
            if why is not None:
                error = ModelFileTruncatedError(why)
                self.engine.fail(error)
                raise error

    def close(self) -> None:
        """Cancel a request in flight, wait for it to end, then free everything now (the
        streamer's descriptors and buffers, the sampler, the context, the model).
        Idempotent; any thread."""
        self._closed = True
        self.engine.close(self._release)

    def _release(self) -> None:
        if self.governor is not None:
            self.governor.close()
        self._backend.close_sampler()
        keep_at_close(self.prompt_cache, self.engine.keep_context_state)
        if self.profile is not None:
            self.profile.save()
        if self.streaming is not None:
            self.streaming.close()
        if self.vision is not None:
            self.vision.close()
        self.ctx.close()
        self._decisions.close()
        self.model.close()
        self._parallel.after = None  # the cycle back to the session: a dropped session is freed at once

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
