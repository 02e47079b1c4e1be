"""The usage profile (``--profile``) on real streamed sessions: one session learns a profile,
the next warms its cache from it and serves its first request with fewer misses and the same
text bit for bit; the fast path warms and decides exactly as the reference policy; a broken,
foreign or truncated profile is ignored with one line and replaced by a good one; processes
merge into one file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.cache_dirs import profile_dir
from bmoe.adapters.llama import ContextParams
from bmoe.adapters.usage_profile_file import model_key
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig, StreamCounters
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
PROMPTS = ["The quick brown fox jumps over the lazy dog", "Once upon a time"]


def config(path: Path, profile: str, policy: str = "fast", cache_mb: int | None = 2) -> SessionConfig:
    stream = StreamConfig(enabled=True, cache_mb=cache_mb, governor="off", profile=profile, policy=policy)
    return SessionConfig(model_path=path, context=PARAMS, stream=stream)


def serve(session: Session) -> tuple[list[tuple[int, ...]], StreamCounters, np.ndarray]:
    """Each prompt's tokens, the first request's counters, the last logits."""
    texts = []
    first = None
    for i, prompt in enumerate(PROMPTS):
        request = GenerateRequest(
            prompt, n_predict=16, clear_kv=True, sampling=SamplingParams(temp=0.9, seed=i)
        )
        result = session.generate(request)
        texts.append(tuple(result.tokens))
        if first is None:
            assert session.streaming is not None
            first = session.streaming.counters()
    assert first is not None
    return texts, first, session.last_logits()


def test_a_learned_profile_warms_the_next_session_with_fewer_misses_and_the_same_text(
    tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    path = tiny_model_path("qwen3moe")
    profile = tmp_path / "p.json"
    with Session.open(config(path, "off")) as plain:
        expected, cold, logits = serve(plain)
    with Session.open(config(path, str(profile))) as learner:
        assert any("none yet" in note for note in learner.notes)
        assert serve(learner)[0] == expected
    doc = json.loads(profile.read_text())
    assert doc["sessions"] == 1 and doc["tokens"] > 0
    with Session.open(config(path, str(profile))) as warm:
        assert warm.profile is not None and warm.profile.warmed is not None
        assert any(note.startswith("moe-profile: warming") for note in warm.notes)
        texts, first, warm_logits = serve(warm)
    assert texts == expected
    assert np.array_equal(warm_logits, logits)
    assert first.misses < cold.misses
    # the warm-up's reads are its own, not prefetches: adopted, they are plain hits (a
    # prefetch line of "2 read ahead, 32 used (1600%)" counted them as prefetches)
    assert first.warm_issued == warm.profile.warmed.entries
    assert first.prefetch_hits <= first.prefetch_issued
    assert json.loads(profile.read_text())["sessions"] == 2


def test_the_fast_path_warms_and_decides_as_the_reference(tiny_model_path: TinyModel, tmp_path: Path) -> None:
    path = tiny_model_path("qwen3moe")
    profile = tmp_path / "p.json"
    with Session.open(config(path, str(profile))) as learner:
        serve(learner)
    learned = profile.read_bytes()
    runs = []
    for policy in ("fast", "reference"):
        profile.write_bytes(learned)  # each starts from the same profile
        with Session.open(config(path, str(profile), policy=policy)) as s:
            assert s.streaming is not None
            texts, first, _ = serve(s)
            runs.append(
                (texts, first.decisions(), s.streaming.counters().decisions(), s.streaming.resident_entries())
            )
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"format": "bmoe-usage-profile", "version": 1, "model_key": "someone else"',
        b'{"format": "bmoe-usage-profile", "version": 99}',
        b"\xff\xfe\x00",
        b"",
    ],
    ids=["corrupt", "truncated", "other-version", "binary", "empty"],
)
def test_a_broken_profile_is_ignored_with_one_line_and_replaced(
    tiny_model_path: TinyModel, tmp_path: Path, content: bytes
) -> None:
    path = tiny_model_path("qwen3moe")
    profile = tmp_path / "p.json"
    profile.write_bytes(content)
    with Session.open(config(path, "off")) as plain:
        expected = serve(plain)[0]
    with Session.open(config(path, str(profile))) as s:
        ignored = [note for note in s.notes if note.startswith("moe-profile: ignored")]
        assert len(ignored) == 1 and s.profile is not None and s.profile.warmed is None
        assert serve(s)[0] == expected
    assert json.loads(profile.read_text())["sessions"] == 1  # a good one took its place


def test_another_models_profile_is_not_trusted(tiny_model_path: TinyModel, tmp_path: Path) -> None:
    mine, other = tiny_model_path("qwen3moe"), tiny_model_path("qwen3moe", seed=1)
    assert model_key([mine]) != model_key([other])  # same shape, other weights
    profile = tmp_path / "p.json"
    with Session.open(config(other, str(profile))) as s:
        serve(s)
    with Session.open(config(mine, str(profile))) as s:
        assert any("learned on another model" in note for note in s.notes)
        assert s.profile is not None and s.profile.warmed is None


def test_auto_keeps_one_profile_per_model_and_sessions_merge(
    tiny_model_path: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BMOE_PROFILE_DIR", str(tmp_path / "profiles"))
    path = tiny_model_path("qwen3moe")
    for _ in range(2):
        with Session.open(config(path, "auto")) as s:
            serve(s)
    file = profile_dir() / f"{model_key([path])}.json"
    doc = json.loads(file.read_text())
    assert doc["sessions"] == 2
    assert [p.name for p in file.parent.glob("*.json")] == [file.name]


def test_without_a_cache_the_profile_learns_and_warms_nothing(
    tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    path = tiny_model_path("qwen3moe")
    profile = tmp_path / "p.json"
    for _ in range(2):
        with Session.open(config(path, str(profile), cache_mb=0)) as s:
            serve(s)
            assert s.profile is not None and s.profile.warmed is None
    assert json.loads(profile.read_text())["sessions"] == 2
