"""One rule for bmoe's cache files (docs/files.md): the root is ``$BMOE_CACHE_DIR``, else
``$XDG_CACHE_HOME/bmoe``, else ``~/.cache/bmoe``; each kind has its place under it, and a
kind's own variable, where it has one, moves it alone. Each kind is asked through the code
that uses it (the profile of ``--profile auto``, the probe's cache, a fixture's folder, the
bench's folder)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters import cpu_features
from bmoe.adapters.cache_dirs import bench_dir, probe_verdict_file
from bmoe.adapters.usage_profile_file import profile_path
from bmoe.domain.cpu_features import AmxVerdict
from bmoe.tinymodel.cache import model_dir
from bmoe.tinymodel.spec import GENERATOR_VERSION

KEY = "0123456789abcdef01234567"
ALL_VARIABLES = ("BMOE_CACHE_DIR", "XDG_CACHE_HOME", "BMOE_PROFILE_DIR", "BMOE_FIXTURE_DIR", "BMOE_BENCH_DIR")


def _auto_profile() -> Path:
    path = profile_path("auto", KEY)
    assert path is not None
    return path


def _fixture_folder() -> Path:
    return model_dir("qwen3moe", 0)


# kind -> (where the code that uses it looks, that place relative to the root, its own variable)
KINDS: dict[str, tuple[Callable[[], Path], Path, str | None]] = {
    "profiles": (_auto_profile, Path("profiles") / f"{KEY}.json", "BMOE_PROFILE_DIR"),
    "probe verdict": (probe_verdict_file, Path("cpu-probe.json"), None),
    "fixtures": (
        _fixture_folder,
        Path("fixtures") / f"v{GENERATOR_VERSION}" / "qwen3moe-seed0",
        "BMOE_FIXTURE_DIR",
    ),
    "bench models": (bench_dir, Path("bench"), "BMOE_BENCH_DIR"),
}
OVERRIDDEN = [kind for kind, (_, _, own) in KINDS.items() if own]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own and none of the variables set (tests/conftest.py sets one)."""
    for name in ALL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("kind", KINDS)
def test_with_nothing_set_each_kind_lives_under_dot_cache_bmoe(kind: str, home: Path) -> None:
    where, place, _ = KINDS[kind]
    assert where() == home / ".cache" / "bmoe" / place


@pytest.mark.parametrize("kind", KINDS)
def test_xdg_cache_home_moves_each_kind(
    kind: str, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where, place, _ = KINDS[kind]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert where() == tmp_path / "xdg" / "bmoe" / place


@pytest.mark.parametrize("kind", KINDS)
def test_bmoe_cache_dir_moves_each_kind_before_xdg(
    kind: str, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where, place, _ = KINDS[kind]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("BMOE_CACHE_DIR", str(tmp_path / "mine"))
    assert where() == tmp_path / "mine" / place


@pytest.mark.parametrize("kind", OVERRIDDEN)
def test_a_kinds_own_variable_moves_it_alone_before_the_root(
    kind: str, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where, place, own = KINDS[kind]
    assert own is not None
    monkeypatch.setenv("BMOE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv(own, str(tmp_path / "own"))
    # the variable names the kind's folder: what the kind keeps under its folder stays so
    assert where() == tmp_path / "own" / Path(*place.parts[1:])
    others = [other for other in KINDS if other != kind]
    assert all(KINDS[other][0]() == tmp_path / "mine" / KINDS[other][1] for other in others)


@pytest.mark.parametrize("kind", KINDS)
def test_a_relative_xdg_cache_home_and_empty_variables_count_as_unset(
    kind: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where, place, own = KINDS[kind]
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignore it
    monkeypatch.setenv("BMOE_CACHE_DIR", "")
    if own:
        monkeypatch.setenv(own, "")
    assert where() == home / ".cache" / "bmoe" / place


def test_the_probe_writes_its_verdict_where_the_rule_says(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BMOE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setattr(cpu_features, "run_probe", lambda: AmxVerdict(usable=False, why="test"))
    assert cpu_features.probe_amx() == AmxVerdict(usable=False, why="test")
    assert (tmp_path / "mine" / "cpu-probe.json").is_file()
    assert not (home / ".cache").exists()
