"""Exact after a warm start (issue 43): a streamed session that warms its cache from a usage
profile (what every user gets from the second run on: ``--profile auto`` is the command
line's and the server's default) prints what the resident model prints, bit for bit.

The fixtures are the issue's: a ``qwen3moe`` of 4 layers, 8 experts, top-2 and hidden 256,
written in F32 and then quantized by llama.cpp's own quantizer to F16, Q8_0, Q4_0 and its
``Q4_K_M`` mix. On each:

- **a second process warms**: the command line run as a user runs it (a fresh profile
  folder; one run learns, the next ones warm from what it wrote), fast path and reference,
  compared with the resident run's text;
- **the warm-up races the first request**: 50 sessions each, every one opened warm and asked
  at once, varying what widens or narrows the race (a prompt of one token, a profile that
  names every expert, a cache smaller than the profile, one to four lanes, lanes slowed to a
  slow disk's pace, fast path and reference, greedy and seeded sampling); each run's tokens,
  log-probabilities and last logits equal the resident run's, and the fast path never had to
  wait for a read its plan did not adopt (``unplanned_waits``, the engine's safety net).

Before the fix, the race showed in most runs (3 of 4 warmed runs of the F32 fixture printed
another text than resident); the state machine of ``tests/unit/test_cache_core_equals_policy.py``
pins the rule itself.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import llama_cpp
import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.adapters.usage_profile_file import model_key, update_profile
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import EngineOptions, StreamConfig
from bmoe.domain.streaming.usage_profile import merge
from bmoe.runtime import Session, SessionConfig
from bmoe.tinymodel.archs import qwen3moe
from bmoe.tinymodel.default import DEFAULT_SPEC
from bmoe.tinymodel.writer import write_model

# llama.cpp's llama_ftype values of the quantized kinds
KINDS = {"F32": None, "F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15}
SPEC = attrs.evolve(
    DEFAULT_SPEC, name="warm-256", dims=attrs.evolve(DEFAULT_SPEC.dims, n_embd=256, n_ff_exp=256)
)
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
PROMPTS = ("hello world, the thing", "A")  # the issue's, and one of a single token
RUNS = 50
CLI_PROMPT = "hello world, the thing"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each kind's GGUF: the F32 model written, the others quantized from it by llama.cpp."""
    folder = tmp_path_factory.mktemp("warm-models")
    f32 = write_model(SPEC, qwen3moe, folder / "f32", 0)
    paths = {"F32": f32}
    for kind, ftype in KINDS.items():
        if ftype is None:
            continue
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 2
        out = folder / f"{kind}.gguf"
        rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params))
        assert rc == 0, f"llama.cpp could not quantize the fixture to {kind}"
        paths[kind] = out
    return paths


def cli(model: Path, profiles: Path, *flags: str) -> str:
    """The command line's text on stdout, as a user runs it (the profile on by default)."""
    env = {**os.environ, "BMOE_PROFILE_DIR": str(profiles)}
    args = ["-m", str(model), "-c", "256", "-n", "24", "-t", "2", "--temp", "0", "-p", CLI_PROMPT]
    done = subprocess.run(
        [sys.executable, "-m", "bmoe.cli", *args, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_second_process_warmed_from_the_profile_prints_the_resident_text(
    models: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    model = models[kind]
    expected = cli(model, tmp_path)
    stream = ("--moe-stream", "--cache-mb", "64")
    assert cli(model, tmp_path, *stream) == expected  # learns
    assert len(list(tmp_path.glob("*.json"))) == 1
    for flags in [(), (), ("--stream-policy", "reference"), ("--io-threads", "2")]:
        assert cli(model, tmp_path, *stream, *flags) == expected, flags


@attrs.frozen
class Run:
    """One warm start of the stress gate."""

    prompt: str
    seed: int | None  # None: greedy
    policy: str
    lanes: int
    every_expert: bool  # the profile names every expert (else: the one a session learned)
    small_cache: bool  # the cache holds less than the profile names
    slow_lanes: bool  # the worker lanes read at a slow disk's pace

    @property
    def request(self) -> GenerateRequest:
        sampling = SamplingParams(temp=0.0) if self.seed is None else SamplingParams(temp=0.9, seed=self.seed)
        return GenerateRequest(self.prompt, n_predict=12, clear_kv=True, sampling=sampling, logprobs=2)


def runs() -> Iterator[Run]:
    """Every variant, cycled with coprime periods so that the 50 runs mix them."""
    for i in range(RUNS):
        yield Run(
            prompt=PROMPTS[1] if i % 3 == 2 else PROMPTS[0],
            seed=None if i % 2 == 0 else i % 3,
            policy="reference" if i % 5 == 4 else "fast",
            lanes=1 + i % 4,
            every_expert=i % 7 in (1, 4),
            small_cache=i % 11 in (3, 8),
            slow_lanes=i % 4 == 1,
        )


def stream_config(profile: Path, run: Run | None) -> StreamConfig:
    if run is None:  # the learning session
        return StreamConfig(enabled=True, cache_mb=64, governor="off", profile=str(profile))
    return StreamConfig(
        enabled=True,
        cache_mb=2 if run.small_cache else 64,
        governor="off",
        profile=str(profile),
        profile_share=1.0 if run.every_expert else 0.75,
        policy=run.policy,
        io_threads=run.lanes,
        engine=EngineOptions(lane_delay_us=3000 if run.slow_lanes else 0),
    )


def outcome(session: Session, request: GenerateRequest) -> tuple[tuple[int, ...], tuple[object, ...], bytes]:
    result = session.generate(request)
    return result.tokens, result.logprobs, np.asarray(session.last_logits()).tobytes()


def every_expert_profile(model: Path, path: Path) -> None:
    n = SPEC.dims.n_layer * SPEC.dims.n_expert
    update_profile(
        path,
        model_key([model]),
        SPEC.dims.n_layer,
        SPEC.dims.n_expert,
        lambda p: merge(p, [1] * n, tokens=1.0, new_session=True),
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_warm_up_racing_the_first_request_never_changes_a_token(
    models: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    model = models[kind]
    learned = tmp_path / "learned.json"
    named = tmp_path / "every.json"
    every_expert_profile(model, named)
    resident: dict[GenerateRequest, tuple[tuple[int, ...], tuple[object, ...], bytes]] = {}
    with Session.open(SessionConfig(model_path=model, context=PARAMS)) as s:
        for run in runs():
            if run.request not in resident:
                resident[run.request] = outcome(s, run.request)
    learner = SessionConfig(model_path=model, context=PARAMS, stream=stream_config(learned, None))
    with Session.open(learner) as s:
        for prompt in PROMPTS:
            s.generate(GenerateRequest(prompt, n_predict=12, clear_kv=True))
    warmed = 0
    for i, run in enumerate(runs()):
        config = SessionConfig(
            model_path=model,
            context=PARAMS,
            stream=stream_config(named if run.every_expert else learned, run),
        )
        with Session.open(config) as s:
            assert s.profile is not None
            warmed += s.profile.warmed is not None
            got = outcome(s, run.request)  # asked at once: the warm-up's reads are in flight
            assert s.streaming is not None
            stats = s.streaming.streaming.streamer.stats()
        assert got[0] == resident[run.request][0], f"run {i}: {run}"
        assert got == resident[run.request], f"run {i}: {run} (log-probabilities or logits)"
        assert stats["unplanned_waits"] == 0, f"run {i}: {run}"
    assert warmed >= RUNS - 10  # only some small caches warm nothing
