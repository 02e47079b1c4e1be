"""A session's decisions, wired (spec/decide.md): the decide probe (``--decide-probe``)
chained into the context's eval callback, the backend over the session's context, the
prefix states kept between decisions, and the ``Decider`` that runs them
(``bmoe.service.decider``). A session opened without decisions allocates none of it, and
refuses them.
"""

from __future__ import annotations

from collections.abc import Callable

from bmoe.adapters.chat_template import JinjaChatTemplate
from bmoe.adapters.decide_probe import LlamaDecideProbe
from bmoe.adapters.llama import LlamaContext, LlamaModel
from bmoe.adapters.llama.context import CCallback
from bmoe.adapters.llama.decide_backend import LlamaDecideBackend
from bmoe.adapters.llama.vision import VisionEncoder
from bmoe.adapters.llama.vision_backend import VisionDecideBackend
from bmoe.domain.decide import DecideConfig, DecideRequest, DecideResult, new_prefix_cache
from bmoe.domain.decide.piece_policy import PieceMeter
from bmoe.errors import DecideDisabledError
from bmoe.runtime.streaming import StreamingControl
from bmoe.service.decider import DECIDE_DISABLED, Decider
from bmoe.service.session_engine import OnBegin, SessionEngine


class SessionDecisions:
    """``hook`` while the context is created, ``attach`` once the engine is there, ``close``
    with the session (the probe's file and head)."""

    def __init__(self, config: DecideConfig, model: LlamaModel) -> None:
        self.config = config
        self.model = model
        self.probe: LlamaDecideProbe | None = None
        self.prefix_cache = new_prefix_cache(config.prefix_slots) if config.enabled else None
        self.backend: LlamaDecideBackend | None = None
        self.decider: Decider | None = None

    def hook(self, inner: CCallback | None, n_ubatch: int) -> CCallback | None:
        """The eval callback of a context of ubatch ``n_ubatch``: ``inner`` (the streamer's,
        or none), wrapped by the decide probe when ``--decide-probe`` asks for one (nothing is
        installed otherwise)."""
        if self.config.probe is None:
            return inner
        self.probe = LlamaDecideProbe.open(self.model, n_ubatch, self.config.probe, inner)
        return self.probe.callback

    def attach(
        self,
        engine: SessionEngine,
        ctx: LlamaContext,
        template: JinjaChatTemplate,
        streaming: StreamingControl | None,
        after: Callable[[], None],
        encoder: VisionEncoder | None = None,
    ) -> None:
        """Decisions over ``ctx`` as requests in flight of ``engine``; streamed, each one's
        reads are counted and its pieces' costs measured (``after`` follows it)."""
        if not self.config.enabled or self.prefix_cache is None:
            return
        self.backend = (
            LlamaDecideBackend(self.model, ctx, template)
            if encoder is None
            else VisionDecideBackend(self.model, ctx, template, encoder)
        )
        meter = None
        if streaming is not None:
            meter = PieceMeter(streaming.info.expert_bytes, self.model.n_expert, self.model.n_expert_used)
        self.decider = Decider(
            engine, self.backend, self.prefix_cache, self.config, self.probe, streaming, meter, after
        )

    def decide(self, request: DecideRequest, on_begin: OnBegin | None = None) -> DecideResult:
        """``DecideDisabledError`` in a session without decisions."""
        if self.decider is None:
            raise DecideDisabledError(DECIDE_DISABLED)
        return self.decider.decide(request, on_begin)

    def forget(self) -> None:
        """Drop the kept prefix states (another request takes the context)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()
