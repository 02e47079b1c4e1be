"""A session's streamer holds the setup knobs its ``StreamConfig`` says, in one value
(``StreamingControl.settings``, ``ExpertStreamer.configure``): the fast path all of them, the
reference policy's streamer only the eviction rule and the engine options (the policy, fed
from the same value, decides the rest)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.cext.expert_stream import ExpertStreamer
from bmoe.domain.streaming import StreamConfig
from bmoe.domain.streaming.streamer_settings import StreamerSettings
from bmoe.runtime import Session, SessionConfig

PARAMS = ContextParams(n_ctx=64, n_batch=16, n_ubatch=16, n_threads=2)


def bare_streamer_holding(settings: StreamerSettings) -> dict[str, object]:
    """What a new streamer holds once it takes ``settings`` (its routers known)."""
    s = ExpertStreamer(n_layer=2, n_expert=4, n_proj=1)
    try:
        s.set_router(8, 2, 1)
        s.configure(settings)
        return s.settings()
    finally:
        s.close()


@pytest.mark.parametrize("policy", ["fast", "reference"])
@pytest.mark.parametrize(
    "knobs",
    [
        {"eviction": "slru", "half_life": 3, "prefetch": 1, "prefill_ahead": False},
        {"predict_prefetch": True, "predict_auto": True, "predict_spec_max": 1, "predict_depth": 2},
        {"pass_layers": True},
    ],
    ids=["read-ahead", "routing", "passing"],
)
def test_the_session_streamer_holds_the_settings_of_its_config(
    tiny_model_path: Callable[[str], Path], policy: str, knobs: dict[str, object]
) -> None:
    stream = StreamConfig(enabled=True, cache_mb=None, policy=policy, **knobs)  # type: ignore[arg-type]
    with Session.open(
        SessionConfig(model_path=tiny_model_path("qwen3moe"), context=PARAMS, stream=stream)
    ) as s:
        assert s.streaming is not None, s.notes
        control = s.streaming
        assert control.settings == StreamerSettings.of(stream, control.streaming.engine)
        taken = control.settings if policy == "fast" else control.settings.for_reference()
        assert control.streaming.streamer.settings() == bare_streamer_holding(taken)
