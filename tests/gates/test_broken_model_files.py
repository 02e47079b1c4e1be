"""Broken model files: one clear error and a non-zero exit, never a crash or a hang.

A corpus made from the ``qwen3moe`` fixture (``broken_gguf.py``): truncated at many offsets,
bad magic, unknown versions, absurd counts, string lengths, dimensions, types and tensor
offsets, and a split model with a shard missing, from another model, swapped, truncated or
a directory. Each case runs the CLI in a subprocess under a timeout: it must exit with
status 1 (not a signal), print exactly one ``bmoe: error:`` line and no traceback. In
``--session`` mode the one line is a fatal ``BMOE_ERROR``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from broken_gguf import single_file_cases, split_cases  # beside this file (pytest puts it on sys.path)

from bmoe.adapters.gguf_layout import shard_paths, validate_model_files
from bmoe.errors import ModelLoadError

TinyModel = Callable[[str], Path]
TIMEOUT_S = 60
ACCEPTED = {"version-2"}  # ggml reads GGUF v2 with the same layout: not broken


@pytest.fixture(scope="module")
def corpus(tiny_model_path: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("broken")
    cases: dict[str, Path] = {}
    for name, data in single_file_cases(tiny_model_path("qwen3moe")):
        if name in ACCEPTED:
            continue
        path = root / f"{name}.gguf"
        path.write_bytes(data)
        cases[name] = path
    shards = shard_paths(tiny_model_path("qwen3moe-split"))
    for name, first in split_cases(shards, tiny_model_path("qwen3moe-odd"), root / "split"):
        cases[name] = first
    folder = root / "a-directory.gguf"
    folder.mkdir()
    cases["a-directory"] = folder
    cases["not-there"] = root / "not-there.gguf"
    renamed = root / "renamed-shard.gguf"
    shutil.copyfile(shards[0], renamed)
    cases["renamed-shard"] = renamed
    return cases


def _run(args: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "bmoe.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT_S,  # a hang fails the test with TimeoutExpired
    )


def _assert_one_clear_error(proc: subprocess.CompletedProcess[bytes], path: Path) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, (proc.returncode, err[-2000:])  # < 0 would be a signal
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("bmoe: error:")]
    assert len(lines) == 1, err
    assert str(path.parent) in lines[0] or path.name in lines[0], lines[0]
    return lines[0]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "any_case" in metafunc.fixturenames:
        metafunc.parametrize("any_case", _all_case_names())


def _all_case_names() -> list[str]:
    """The corpus's names, without building it (collection must stay cheap)."""
    from bmoe.testing.fixtures import fixture_path

    names = [name for name, _ in single_file_cases(fixture_path("qwen3moe")) if name not in ACCEPTED]
    split = ["shard-missing", "shard-from-another-model", "shards-swapped", "shard-truncated"]
    split += ["shard-count-wrong", "shard-is-a-directory"]
    return [*names, *split, "a-directory", "not-there", "renamed-shard"]


def test_a_broken_file_gives_one_clear_error(corpus: dict[str, Path], any_case: str) -> None:
    path = corpus[any_case]
    _assert_one_clear_error(_run(["-m", str(path), "-n", "2"]), path)


@pytest.mark.parametrize(
    "case",
    ["truncated-at-1000", "bad-magic", "n-kv-4611686018427387904", "dim-1099511627776", "type-200",
     "tensor-offset-past-end", "shard-truncated", "shards-swapped", "shard-from-another-model"],
)  # fmt: skip
def test_a_broken_file_gives_one_clear_error_when_streaming(corpus: dict[str, Path], case: str) -> None:
    path = corpus[case]
    _assert_one_clear_error(_run(["-m", str(path), "-n", "2", "--moe-stream", "--cache-mb", "1"]), path)


@pytest.mark.parametrize("case", ["truncated-at-200", "shard-missing", "a-directory"])
def test_a_session_on_a_broken_file_answers_one_fatal_error(corpus: dict[str, Path], case: str) -> None:
    path = corpus[case]
    proc = _run(["--session", "-m", str(path)], stdin=b'{"cmd":"generate","prompt":"x"}\n')
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("BMOE_ERROR "), lines
    error = json.loads(lines[0].removeprefix("BMOE_ERROR "))
    assert error["fatal"] is True and error["id"] is None and str(path.parent) in error["msg"]


def test_the_unbroken_files_pass_validation_and_run(tiny_model_path: TinyModel) -> None:
    for name in ("qwen3moe", "qwen3moe-split", "qwen35moe"):
        validate_model_files(tiny_model_path(name))
    proc = _run(["-m", str(tiny_model_path("qwen3moe-split")), "-n", "2"])
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("bad-magic", "is not a GGUF file (it starts with b'GGUX'"),
        ("version-4", "is GGUF version 4; llama.cpp reads versions 2 and 3"),
        ("truncated-at-40", "has a broken GGUF header"),
        ("shard-missing", "split model is missing shard(s)"),
        ("shards-swapped", "says it is shard 3 of 3, but its name says shard 2 of 3"),
        ("shard-from-another-model", "is not a shard of a split model"),
        ("shard-truncated", "is truncated or corrupt: tensor"),
        ("a-directory", "is a directory, not a model file"),
        ("renamed-shard", "is shard 1 of a model split in 3 files"),
    ],
)
def test_the_error_names_the_problem(corpus: dict[str, Path], case: str, words: str) -> None:
    with pytest.raises(ModelLoadError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate_model_files(corpus[case])
