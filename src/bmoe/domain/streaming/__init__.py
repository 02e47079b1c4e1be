"""Expert streaming policy and values: settings (``config``), the budget rule (``budget``), the
cache policy (``cache_policy``), the engine's A/B switches (``engine_options``), faults
(``fault``) and the figures a run reports (``counters``). Pure: no I/O, no llama.cpp."""

from bmoe.domain.streaming.budget import Budget, RunMemory, resolve_budget
from bmoe.domain.streaming.cache_policy import (
    CacheCounters,
    Entry,
    ExpertCachePolicy,
    LayerPlan,
    PrefetchPlan,
)
from bmoe.domain.streaming.config import (
    GOVERNOR_MODES,
    MIB,
    STREAM_POLICIES,
    StreamConfig,
    prompt_batch,
)
from bmoe.domain.streaming.counters import StreamCounters, StreamReport
from bmoe.domain.streaming.engine_options import EngineOptions, PageRelease
from bmoe.domain.streaming.fault import GraphFault, ReadFault, StreamFault

__all__ = [
    "GOVERNOR_MODES",
    "MIB",
    "STREAM_POLICIES",
    "Budget",
    "CacheCounters",
    "EngineOptions",
    "Entry",
    "ExpertCachePolicy",
    "GraphFault",
    "LayerPlan",
    "PageRelease",
    "PrefetchPlan",
    "ReadFault",
    "RunMemory",
    "StreamConfig",
    "StreamCounters",
    "StreamFault",
    "StreamReport",
    "prompt_batch",
    "resolve_budget",
]
