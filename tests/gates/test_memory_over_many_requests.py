"""A long-lived session does not grow: after a warm-up, 1,000 requests of every kind in one
session (and 100 sessions opened and closed) leave the resident memory, the open file
descriptors, the threads and the Python objects where they were.

The requests mix what a session does in an app: raw generations (one kind with prompts of up
to two batches), chat turns that continue the conversation, decisions (prefix state kept
and restored), perplexities, a generation cancelled in decode, and one refused for its
length.
Streamed sessions run an evicting cache (6 entries of the 32 a model has), so entries are
read, evicted (their pages given back) and read again all along.

Tolerances, from the measured spread (a loaded 2-core machine, 1,000 requests after 100 of
warm-up, RSS sampled every 100 requests, several runs with one and with two compute
threads): resident RSS rose by at most 0.6 MiB on the way and ended 0.1-0.2 MiB above its
baseline (about 70.6 MiB), streamed by at most 0.25 MiB; open/close cycles by at most
0.36 MiB (and once fell by 4 MiB); Python objects moved by -3 to +31, the samples kept
included. The bound is 3 MiB of RSS (5 times the largest excursion; over 1,000 requests it
catches a native leak of 3 KiB a request or more, over 100 cycles one of 30 KiB a session:
the tiny model's KV cache alone is 1 MiB) and 100 Python objects (one leaked object a
request is 1,000). Descriptors and threads: nothing new.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.decide import DecideConfig, DecideRequest
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ContextOverflowError
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
MIB = 1024 * 1024
RSS_TOLERANCE = 3 * MIB
OBJECTS_TOLERANCE = 100
N_REQUESTS = 1000
WARM_UP = 100
CACHE_ENTRIES = 6
# one compute thread: ggml's threads spin at their barriers, and on a loaded 2-core machine
# two of them made a request 50 times slower (0.5 s instead of 11 ms)
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "the", "cat", "sleeps"]


@attrs.frozen
class Usage:
    rss: int
    fds: frozenset[str]
    threads: int
    py_threads: frozenset[threading.Thread]
    objects: int

    @staticmethod
    def now() -> Usage:
        gc.collect()
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return Usage(
            rss=rss,
            fds=frozenset(os.listdir("/proc/self/fd")),
            threads=len(os.listdir("/proc/self/task")),
            py_threads=frozenset(threading.enumerate()),
            objects=len(gc.get_objects()),
        )


def assert_back_at(base: Usage, samples: list[Usage], what: str) -> None:
    """Every sample within the tolerances of the baseline; nothing new open or running at
    the end (a descriptor or thread of an earlier test may have gone meanwhile)."""
    growth = [round((u.rss - base.rss) / MIB, 2) for u in samples]
    figures = f"{what}: RSS {base.rss / MIB:.1f} MiB at the baseline, then {growth} MiB"
    assert max(u.rss for u in samples) - base.rss < RSS_TOLERANCE, figures
    end = samples[-1]
    assert end.objects - base.objects < OBJECTS_TOLERANCE, (base.objects, end.objects)
    assert end.fds - base.fds == set(), what
    assert end.py_threads - base.py_threads == set(), what
    assert end.threads <= base.threads, what


def prompt(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 9))


def one_request(s: Session, i: int) -> None:
    """Request ``i`` of the mix (ten kinds in turn)."""
    kind = i % 10
    sampling = SamplingParams(temp=1.0, seed=i)
    if kind in (0, 1, 2):
        s.generate(GenerateRequest(prompt(i), n_predict=4, sampling=sampling))
    elif kind in (3, 4):  # a chat, restarted every fifth turn
        turn = GenerateRequest(prompt(i), n_predict=3, clear_kv=i % 50 == 3, sampling=sampling)
        s.generate(turn, chat=True)
    elif kind == 5:
        s.decide(DecideRequest(prefix="Answer yes or no. ", suffix=prompt(i), choices=("yes", "no")))
    elif kind == 6:
        s.perplexity(f"{prompt(i)} {prompt(i + 1)}")
    elif kind == 7:

        def cancel_at_two(p: Progress) -> None:
            if p.step == 2:
                s.cancel()

        long = GenerateRequest(prompt(i), n_predict=50, sampling=sampling)
        result = s.generate(long, on_progress=cancel_at_two)
        assert result.cancelled
    elif kind == 8:
        with pytest.raises(ContextOverflowError):
            s.generate(GenerateRequest(prompt(i), n_predict=10_000))
    else:  # a prompt of two batches
        s.generate(GenerateRequest(" ".join([prompt(i)] * 8), n_predict=2, sampling=sampling))


def open_session(path: Path, streamed: bool, i: int = 0, governor: str = "auto") -> Session:
    stream = StreamConfig(enabled=streamed, cache_mb=0 if i % 4 == 1 else None, governor=governor)
    s = Session.open(
        SessionConfig(model_path=path, context=PARAMS, stream=stream, decide=DecideConfig(enabled=True))
    )
    if streamed:
        assert s.streaming is not None, s.notes
        if i % 4 != 1:  # else the cache is off
            s.streaming.set_budget(CACHE_ENTRIES * s.streaming.info.entry_bytes)
    return s


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed, evicting cache"])
def test_a_thousand_requests_in_one_session_leave_memory_descriptors_and_threads_at_their_baseline(
    tiny_model_path: TinyModel, streamed: bool
) -> None:
    # the governor off: its thread reads /proc twice a second, and a descriptor sampled
    # mid-read is no leak (the open/close cycles below run it, and leave nothing behind)
    with open_session(tiny_model_path("qwen3moe"), streamed, governor="off") as s:
        for i in range(WARM_UP):
            one_request(s, i)
        base = Usage.now()
        samples = []
        for i in range(WARM_UP, WARM_UP + N_REQUESTS):
            one_request(s, i)
            if (i + 1) % 100 == 0:
                samples.append(Usage.now())
        assert_back_at(base, samples, "resident" if not streamed else "streamed")
        if s.streaming is not None:
            counters = s.streaming.counters()
            assert counters.evictions > N_REQUESTS and counters.rereads > 0
            assert counters.resident_bytes <= counters.budget_bytes
        assert s.engine.failed is None


def test_a_hundred_open_close_cycles_leave_memory_at_its_baseline(tiny_model_path: TinyModel) -> None:
    """Resident and streamed sessions in turn (cache auto, off, 6 entries), each with a
    request; the descriptor and thread side of streamed cycles is also pinned in
    ``test_streaming_lifetime.py``."""
    path = tiny_model_path("qwen3moe")

    def cycle(i: int) -> None:
        with open_session(path, streamed=i % 2 == 1, i=i) as s:
            s.generate(GenerateRequest(prompt(i), n_predict=4, sampling=SamplingParams(temp=1.0, seed=i)))
            s.decide(DecideRequest(prefix="Answer yes or no. ", suffix=prompt(i), choices=("yes", "no")))

    for i in range(20):
        cycle(i)
    base = Usage.now()
    samples = []
    for i in range(100):
        cycle(i)
        if (i + 1) % 10 == 0:
            samples.append(Usage.now())
    assert_back_at(base, samples, "open/close cycles")
