"""The prompt cache's disk tier (``--cache-disk DIR``) on real sessions: a conversation
whose state was pushed out of memory (``--cache-ram`` too small for two) comes back from
the disk and prefills only what it added; a restarted session finds the states the
previous one left; a corrupt, truncated or foreign state file is refused with a warning,
removed, and its prompt prefilled; every answer is the one a session without the tier
gives (tokens bit for bit), and a restored turn's log-probabilities those of a session that
holds that conversation as it left it (bit for bit), resident and streamed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)
SYSTEM = ChatMessage("system", "You are a coding agent. Tools: read_file, write_file, list_dir, run_tests.")
TURNS = [("a", "read main.py"), ("b", "list the files"), ("c", "run the tests"), ("a", "now edit it")]


def config(
    path: Path, streamed: bool, ram_mb: int, disk: Path | None, profile: Path | None = None
) -> SessionConfig:
    """Streamed with ``profile``: each session after the first warm from the usage profile
    the ones before it learned (the command line's default, ``--profile auto``)."""
    learned = str(profile) if streamed and profile is not None else "off"
    stream = StreamConfig(enabled=streamed, cache_mb=2, governor="off", profile=learned)
    return SessionConfig(
        model_path=path, context=PARAMS, chat=True, stream=stream, cache_ram_mb=ram_mb, cache_disk=disk
    )


def replay(
    session: Session, turns: list[tuple[str, str]], histories: dict[str, list[ChatMessage]]
) -> list[RunResult]:
    out = []
    for who, prompt in turns:
        history = histories.setdefault(who, [SYSTEM])
        result = session.generate(
            GenerateRequest(prompt, n_predict=6, clear_kv=False, logprobs=2), history=list(history)
        )
        history += [ChatMessage("user", prompt), ChatMessage("assistant", result.text, result.reasoning)]
        out.append(result)
    return out


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_a_state_pushed_out_of_memory_comes_back_from_the_disk(
    tiny_model_path: TinyModel, streamed: bool, tmp_path: Path
) -> None:
    path, disk, profile = tiny_model_path("qwen3moe"), tmp_path / "states", tmp_path / "profile.json"
    with Session.open(config(path, streamed, 0, None, profile)) as plain:
        without = replay(plain, TURNS, {})
    assert profile.is_file() == streamed  # the sessions below start warm from it
    with Session.open(config(path, streamed, 0, disk, profile)) as s:  # no room in memory: disk only
        got = replay(s, TURNS, {})
        cache = s.prompt_cache
        assert cache is not None and len(cache) == 0
        assert cache.counters.spilled == 3 and cache.counters.unspilled == 1  # each switch; a came back
    with Session.open(config(path, streamed, 0, None, profile)) as fresh:  # a's state as a left it
        alone = replay(fresh, [TURNS[0], TURNS[3]], {})[-1]
    assert [r.tokens for r in got] == [r.tokens for r in without]
    assert [r.logprobs for r in got[:3]] == [r.logprobs for r in without[:3]]
    assert got[3].logprobs == alone.logprobs and got[3].n_prompt == alone.n_prompt  # only what it added
    assert got[3].n_restored > 0 and got[3].n_prompt < without[3].n_prompt


@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_a_restarted_session_finds_what_the_last_one_left(
    tiny_model_path: TinyModel, streamed: bool, tmp_path: Path
) -> None:
    path, disk, profile = tiny_model_path("qwen3moe"), tmp_path / "states", tmp_path / "profile.json"
    histories: dict[str, list[ChatMessage]] = {}
    with Session.open(config(path, streamed, 64, disk, profile)) as s:
        replay(s, TURNS[:2], histories)  # a went to memory when b came; b is in the context
    assert len(list(disk.rglob("*.state"))) == 2  # both written at close
    assert profile.is_file() == streamed
    again = [("a", "now edit it"), ("b", "and count them")]
    with Session.open(config(path, streamed, 64, disk, profile)) as s:  # streamed: warm from the profile
        got = replay(s, again, histories)
    with Session.open(config(path, streamed, 0, None, profile)) as plain:
        expected = [
            replay(plain, [*[(w, p) for w, p in TURNS[:2] if w == who], (who, p)], {})[-1] for who, p in again
        ]
    assert all(r.n_restored > 0 for r in got), [r.n_restored for r in got]
    assert [r.tokens for r in got] == [r.tokens for r in expected]
    assert [r.logprobs for r in got] == [r.logprobs for r in expected]


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "foreign"])
def test_a_bad_state_file_is_refused_with_a_warning_and_the_prompt_prefilled(
    tiny_model_path: TinyModel, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tiny_model_path("qwen3moe")
    histories: dict[str, list[ChatMessage]] = {}
    with Session.open(config(path, False, 64, tmp_path)) as s:
        replay(s, TURNS[:1], histories)
    (state,) = tmp_path.rglob("*.state")
    data = bytearray(state.read_bytes())
    if damage == "corrupt":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncated":
        data = data[: len(data) - 100]
    else:  # another model's state copied in: made with another fixture
        other = tmp_path / "other"
        with Session.open(config(tiny_model_path("qwen35moe"), False, 64, other)) as s:
            replay(s, TURNS[:1], {})
        (foreign,) = other.rglob("*.state")
        data = bytearray(foreign.read_bytes())
    state.write_bytes(bytes(data))
    before = {who: list(h) for who, h in histories.items()}
    with Session.open(config(path, False, 64, tmp_path)) as s:
        (got,) = replay(s, [("a", "now edit it")], histories)
        notes = "\n".join(s.notes)
    with Session.open(config(path, False, 0, None)) as plain:  # the whole history prefilled
        (expected,) = replay(plain, [("a", "now edit it")], before)
    assert got.n_restored == 0 and got.tokens == expected.tokens and got.logprobs == expected.logprobs
    assert got.n_prompt == expected.n_prompt  # the whole history prefilled
    assert not state.exists() or state.read_bytes() != bytes(data)  # removed (or replaced at close)
    assert "refused" in notes + capsys.readouterr().err
