"""``Session``: load a model once, answer many prompts (spec/session.md).

The composition root of a session: it opens the llama.cpp model and context (with the C
abort flag that makes ``cancel()`` work), and hands them, as ports, to the policy in
``bmoe.service.session_engine``. ``run()`` in ``bmoe.runtime`` is a thin one-shot wrapper
around it, so both paths are the same machinery.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.adapters.llama.generate_backend import LlamaGenerateBackend
from bmoe.adapters.llama.log import set_llama_verbose
from bmoe.cext.abort_flag import AbortFlag
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.errors import ConfigError
from bmoe.service.session_engine import EngineDefaults, OnBegin, OnProgress, SessionEngine


@attrs.frozen
class SessionConfig:
    """Everything fixed when a session opens.

    - ``context``: context length, batch sizes, threads (fixed for the session's life);
    - ``chat``: prompts are user messages rendered through the model's chat template, and
      ``clear_kv=False`` continues the engine-held conversation; otherwise prompts are raw
      text and ``clear_kv=False`` continues the text;
    - ``think`` / ``n_predict``: defaults for requests that leave them unsaid.
    """

    model_path: Path
    context: ContextParams = attrs.field(factory=ContextParams)
    chat: bool = False
    think: bool = True
    n_predict: int = 128
    verbose: bool = False

    def __attrs_post_init__(self) -> None:
        if self.n_predict < 0:
            raise ConfigError(f"n_predict must be >= 0, not {self.n_predict}")


class Session:
    """A loaded model and its context; ``generate`` runs against that state.

    Use as a context manager, or call ``close()``. ``cancel()`` is thread-safe.
    """

    def __init__(self, config: SessionConfig) -> None:
        """Prefer ``Session.open(config)``."""
        set_llama_verbose(config.verbose)
        t0 = time.perf_counter()
        self.config = config
        self._flag = AbortFlag()
        self.model = LlamaModel(config.model_path)
        try:
            self.ctx = LlamaContext(self.model, config.context, abort=self._flag)
        except BaseException:
            self.model.close()
            raise
        self.template = JinjaChatTemplate(self.model.chat_template)
        self._backend = LlamaGenerateBackend(self.model, self.ctx, self._flag)
        self.engine = SessionEngine(
            self._backend,
            self.template,
            EngineDefaults(chat=config.chat, think=config.think, n_predict=config.n_predict),
        )
        self.load_s = time.perf_counter() - t0
        self._closed = False

    @classmethod
    def open(cls, config: SessionConfig) -> Session:
        """Load the model and create the context (once)."""
        return cls(config)

    # -- facts -----------------------------------------------------------------------------

    @property
    def arch(self) -> str:
        return self.model.arch

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def n_expert(self) -> int:
        return self.model.n_expert

    @property
    def n_expert_used(self) -> int:
        return self.model.n_expert_used

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
    ) -> RunResult:
        """Run one request against the loaded state (see ``SessionEngine.generate``)."""
        if self._closed:
            raise ConfigError("the session is closed")
        return self.engine.generate(request, on_progress, on_begin)

    def cancel(self) -> None:
        """Stop the generate in flight at the next decode boundary (any thread)."""
        self.engine.cancel()

    def last_logits(self) -> npt.NDArray[np.float32]:
        """The logits of the last token computed (a copy), for gates and oracles."""
        return self.ctx.logits(-1)

    # -- ownership -------------------------------------------------------------------------

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._backend.close_sampler()
            self.ctx.close()
            self.model.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
