"""Streaming faults stay fatal: after a failed read every later request (generate, decide,
perplexity) fails with the same error naming file and offset, never with output computed
from an absent expert; the protocol ends the session with one fatal ``BMOE_ERROR``; a
cancel is not a fault and a fault is not a cancel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.decide import DecideConfig, DecideRequest
from bmoe.domain.generation import GenerateRequest, Progress
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import DecodeAbortedError, ExpertGraphError, ExpertReadError
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
PROMPT = "The quick brown fox jumps over the lazy dog"


def open_streamed(path: Path, policy: str = "fast") -> Session:
    cfg = SessionConfig(
        model_path=path,
        context=PARAMS,
        stream=StreamConfig(enabled=True, cache_mb=0, policy=policy),
        decide=DecideConfig(enabled=True),
    )
    return Session.open(cfg)


@pytest.fixture
def model_copy(tiny_model_path: TinyModel, tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_model_path("qwen3moe"), path)
    return path


def truncate_half(path: Path) -> int:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return size // 2


REQUESTS: dict[str, Callable[[Session], object]] = {
    "perplexity": lambda s: s.perplexity(PROMPT),
    "generate": lambda s: s.generate(GenerateRequest(PROMPT, n_predict=2)),
    "decide": lambda s: s.decide(DecideRequest(prefix="Pick one. ", suffix="A or B?", choices=("A", "B"))),
}


@pytest.mark.parametrize("policy", ["fast", "reference"])
@pytest.mark.parametrize("first", list(REQUESTS))
def test_a_file_truncated_under_a_running_session_fails_every_later_request_the_same_way(
    model_copy: Path, policy: str, first: str
) -> None:
    with open_streamed(model_copy, policy) as s:
        s.generate(GenerateRequest(PROMPT, n_predict=2))
        half = truncate_half(model_copy)
        s.ctx.clear()
        # the read itself fails inside llama_decode; the context says why
        with pytest.raises(ExpertReadError, match=rf"expert read failed: {model_copy} at offset (\d+)") as e:
            s.ctx.decode(s.model.tokenize(PROMPT), 0)
        offset = int(str(e.value).split(" at offset ")[1].split(":")[0].split(" ")[0])
        assert offset >= half - 4096
        assert s.ctx.model is s.model and s._flag.faulted and not s._flag.is_set
        messages = set()
        order = [first, *[name for name in REQUESTS if name != first], first]
        for name in order:  # the first request after the fault, then every other, then again
            with pytest.raises(ExpertReadError) as err:
                REQUESTS[name](s)
            messages.add(str(err.value))
        assert messages == {str(e.value)}


@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_a_perplexity_that_hits_the_fault_raises_it_not_a_cancel(model_copy: Path, policy: str) -> None:
    """The reported bug: the first perplexity said "aborted", the second returned log-probs
    computed without the experts."""
    with open_streamed(model_copy, policy) as s:
        s.perplexity(PROMPT)
        truncate_half(model_copy)
        for _ in range(2):
            with pytest.raises(ExpertReadError):
                s.perplexity(PROMPT)


def test_a_replaced_model_file_ends_the_session(tiny_model_path: TinyModel, model_copy: Path) -> None:
    with open_streamed(model_copy) as s:
        s.generate(GenerateRequest(PROMPT, n_predict=2))
        model_copy.unlink()
        shutil.copy(tiny_model_path("qwen3moe"), model_copy)
        for request in REQUESTS.values():
            with pytest.raises(ExpertReadError, match="replaced or truncated under the session"):
                request(s)


def test_a_routing_the_policy_cannot_serve_is_a_graph_fault_not_a_silent_return(model_copy: Path) -> None:
    with open_streamed(model_copy, "reference") as s:
        reference = s.streaming._reference
        assert reference is not None
        sizes = list(reference.policy.entry_bytes)
        sizes[1] = 0  # as if layer 1's experts had not been found in the file
        reference.policy.entry_bytes = tuple(sizes)
        with pytest.raises(ExpertGraphError, match="cannot serve layer 1: layer 1 has no routed experts"):
            s.generate(GenerateRequest(PROMPT, n_predict=2))
        with pytest.raises(ExpertGraphError):
            s.perplexity(PROMPT)


def test_a_cancel_is_not_a_fault(model_copy: Path) -> None:
    with open_streamed(model_copy) as s:
        s._flag.set()  # what cancel() does to a decode in flight
        with pytest.raises(DecodeAbortedError):
            s.ctx.decode(s.model.tokenize(PROMPT), 0)
        s._flag.clear()
        assert not s._flag.faulted and s.streaming.fault() is None
        assert len(s.generate(GenerateRequest(PROMPT, n_predict=3)).tokens) == 3


def test_the_protocol_ends_the_session_with_one_fatal_error(model_copy: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bmoe.cli",
            "--session",
            "-m",
            str(model_copy),
            "--moe-stream",
            "--cache-mb",
            "0",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().startswith(b"BMOE_READY ")
    truncate_half(model_copy)
    requests = [
        {"cmd": "generate", "id": 1, "prompt": PROMPT, "n_predict": 2},
        {"cmd": "generate", "id": 2, "prompt": PROMPT, "n_predict": 2},
    ]
    out, _ = proc.communicate(b"".join(json.dumps(r).encode() + b"\n" for r in requests), timeout=120)
    lines = out.decode().splitlines()
    errors = [line for line in lines if line.startswith("BMOE_ERROR ")]
    assert len(errors) == 1, lines
    error = json.loads(errors[0].split(" ", 1)[1])
    assert error["fatal"] is True and error["id"] == 1
    assert error["msg"].startswith(f"expert read failed: {model_copy} at offset ")
    assert not any(line.startswith("BMOE_DONE") for line in lines)
    assert proc.returncode != 0


@pytest.mark.parametrize("policy", ["fast", "reference"])
@pytest.mark.parametrize("kind", ["generate", "decide"])
def test_a_read_that_fails_inside_a_request_fails_it_and_every_later_one(
    model_copy: Path, policy: str, kind: str
) -> None:
    """The file is truncated after the request's checks passed (``on_begin``): the read
    inside ``llama_decode`` fails, and that failure (EIO, the offset it read) is what this
    and every later request report."""
    with open_streamed(model_copy, policy) as s:
        s.generate(GenerateRequest(PROMPT, n_predict=2))
        s.streaming.evict_all()

        def cut() -> None:
            truncate_half(model_copy)

        with pytest.raises(
            ExpertReadError, match=r"at offset \d+ \(blk\.\d+\.ffn_\w+_exps\.weight\): Input/output error$"
        ) as e:
            if kind == "generate":
                s.generate(GenerateRequest(PROMPT, n_predict=2), on_begin=cut)
            else:
                s.decide(
                    DecideRequest(prefix="Pick one. ", suffix="A or B?", choices=("A", "B")), on_begin=cut
                )
        for request in [*REQUESTS.values(), *REQUESTS.values()]:
            with pytest.raises(ExpertReadError) as again:
                request(s)
            assert str(again.value) == str(e.value)


def test_a_read_ahead_that_fails_in_the_background_is_the_same_fatal_fault(model_copy: Path) -> None:
    """With reads ahead on the worker lanes, the file is truncated mid-generation: whichever
    read meets it first (on demand or ahead), the request and every later one fail with the
    read error; no token computed after it is returned."""
    cfg = SessionConfig(
        model_path=model_copy,
        context=PARAMS,
        stream=StreamConfig(enabled=True, cache_mb=1, prefetch=2),
        decide=DecideConfig(enabled=True),
    )
    with Session.open(cfg) as s:
        assert s.streaming is not None
        s.streaming.set_budget(3 * s.streaming.info.entry_bytes)

        def cut(p: Progress) -> None:
            if p.step == 3:
                truncate_half(model_copy)

        request = GenerateRequest(PROMPT, n_predict=40, sampling=SamplingParams(temp=1.0, seed=5))
        with pytest.raises(ExpertReadError, match=r"expert read failed: .* at offset \d+") as e:
            s.generate(request, on_progress=cut)
        for again in REQUESTS.values():
            with pytest.raises(ExpertReadError) as later:
                again(s)
            assert str(later.value) == str(e.value)
