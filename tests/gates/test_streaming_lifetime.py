"""A streamed session's lifetime: ``close()`` and ``set_cache_budget()`` from another thread
during a long generation act at a decode boundary (never while the C callback walks the
cache), ``close()`` frees the streamer's descriptors and buffers at once, and open/close
cycles leave descriptors and threads where they were."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import MIB, StreamConfig
from bmoe.errors import ConfigError
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
PROMPT = "The quick brown fox jumps over the lazy dog"


def config(path: Path, policy: str = "fast", cache_mb: int | None = 1024, prefetch: int = 0) -> SessionConfig:
    return SessionConfig(
        model_path=path,
        context=PARAMS,
        stream=StreamConfig(enabled=True, cache_mb=cache_mb, policy=policy, prefetch=prefetch),
    )


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # ended meanwhile
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return sorted(names)


def os_threads_settled(at_most: int, patience_s: float = 5.0) -> int:
    """The process's OS threads once those that are ending have left: ``pthread_join``
    returns when a thread has released its memory, before the kernel removes its task from
    ``/proc/self/task``, so a thread joined a moment ago may still be counted. A thread that
    stays (a leak) is still counted after ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while (n := os_threads()) > at_most and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


@pytest.mark.parametrize(("policy", "prefetch"), [("fast", 0), ("reference", 0), ("fast", 2)])
def test_close_from_another_thread_cancels_waits_and_frees_the_streamer(
    tiny_model_path: TinyModel, policy: str, prefetch: int
) -> None:
    s = Session.open(config(tiny_model_path("qwen3moe"), policy, cache_mb=1, prefetch=prefetch))
    fds_open = open_fds()
    started = threading.Event()
    closer_done = threading.Event()

    def on_progress(p: Progress) -> None:
        if p.step == 5:
            started.set()
            closer_done.wait(0.2)  # the closer is now waiting for this request

    def closer() -> None:
        started.wait(30)
        s.close()
        closer_done.set()

    t = threading.Thread(target=closer)
    t.start()
    request = GenerateRequest(PROMPT, n_predict=400, sampling=SamplingParams(temp=1.0, seed=3))
    result = s.generate(request, on_progress=on_progress)
    t.join(30)
    assert closer_done.is_set()
    assert result.cancelled and 5 <= len(result.tokens) < 400
    assert s.streaming is not None and s.streaming.streaming.streamer.closed
    assert len(open_fds()) < len(fds_open)  # the model file's descriptor went with it
    with pytest.raises(ConfigError, match="closed"):
        s.generate(GenerateRequest(PROMPT, n_predict=2))
    s.close()  # idempotent


@pytest.mark.parametrize(
    ("policy", "prefetch"), [("fast", 0), ("reference", 0), ("fast", 2), ("reference", 2)]
)
def test_budget_changes_from_another_thread_during_a_decode_keep_the_output_exact(
    tiny_model_path: TinyModel, policy: str, prefetch: int
) -> None:
    """With reads ahead, evictions by the other thread meet reads queued or running on the
    lanes (cancelled or waited for): the output stays exact."""
    path = tiny_model_path("qwen3moe")
    request = GenerateRequest(PROMPT, n_predict=120, sampling=SamplingParams(temp=1.0, seed=11))
    with Session.open(SessionConfig(model_path=path, context=PARAMS)) as resident:
        expected = resident.generate(request).tokens
        logits = resident.last_logits()
    with Session.open(config(path, policy, prefetch=prefetch)) as s:
        assert s.streaming is not None
        entry = s.streaming.info.entry_bytes
        stop = threading.Event()
        changes = [0]

        def churn() -> None:
            budgets = [0, 3 * entry, 1024 * MIB, entry]
            while not stop.is_set():
                s.streaming.set_budget(budgets[changes[0] % len(budgets)])  # type: ignore[union-attr]
                changes[0] += 1

        t = threading.Thread(target=churn)
        t.start()
        try:
            result = s.generate(request)
        finally:
            stop.set()
            t.join(30)
        assert changes[0] > 10
        assert result.tokens == expected
        assert np.array_equal(s.last_logits(), logits)
        assert s.streaming.counters().evictions > 0
        assert result.stream is not None  # decode's reads ahead did run (prefill reads ahead anyway)
        assert (result.stream.decode.prefetch_issued > 0) == (prefetch > 0)


def test_a_hundred_open_close_cycles_leave_descriptors_and_threads_at_their_baseline(
    tiny_model_path: TinyModel,
) -> None:
    path = tiny_model_path("qwen3moe")
    for policy in ("fast", "reference"):  # warm-up: llama.cpp's and OpenMP's threads start once
        with Session.open(config(path, policy)) as s:
            s.generate(GenerateRequest(PROMPT, n_predict=2))
    gc.collect()
    fds, threads, py_threads = open_fds(), os_threads(), set(threading.enumerate())
    for i in range(100):
        with Session.open(config(path, "reference" if i % 2 else "fast", cache_mb=0)) as s:
            s.generate(GenerateRequest(PROMPT, n_predict=1))
    # nothing new may be left; a thread or descriptor of an earlier test may have ended meanwhile
    assert open_fds() - fds == set()
    assert set(threading.enumerate()) - py_threads == set()
    assert os_threads_settled(threads) <= threads, thread_names()
