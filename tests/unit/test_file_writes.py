"""bmoe's one rule for writing a file (``bmoe.adapters.file_writes``) and the back-off of a
writer whose files are only a cache (``bmoe.domain.write_health``): kept whole or not at
all, a disk's fault typed and said once, tried again later, said when it works again.
Real faults (a full tmpfs, a read-only mount, the fault-injection preload) are the gates'
(``tests/gates/test_disk_faults.py``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import IO, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bmoe.adapters.file_writes import (
    TEMP_PREFIX,
    CacheWrites,
    replacing,
    staged_folder,
    sweep_temporaries,
    write_file,
)
from bmoe.domain.write_health import WriteHealth
from bmoe.errors import BmoeError, FileNotKeptError


def full_disk(out: IO[Any]) -> None:
    out.write(b"half a state")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_file_is_written_whole_and_no_temporary_is_left(tmp_path: Path) -> None:
    path = write_file(tmp_path / "sub" / "a.json", '{"a": 1}', "a test file")
    assert path.read_text() == '{"a": 1}'
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO, errno.EDQUOT])
def test_a_disk_fault_is_typed_leaves_the_old_file_and_no_temporary(tmp_path: Path, code: int) -> None:
    path = write_file(tmp_path / "a.state", b"old", "a state")

    def fails(out: IO[Any]) -> None:
        out.write(b"new and torn")
        raise OSError(code, os.strerror(code))

    with pytest.raises(FileNotKeptError) as caught:
        write_file(path, fails, "the state after 3 tokens")
    error = caught.value
    assert isinstance(error, BmoeError) and isinstance(error, OSError)
    assert error.errno == code and error.folder == str(tmp_path) and error.what == "the state after 3 tokens"
    assert str(tmp_path) in str(error) and errno.errorcode[code] in str(error)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.state"]


def test_a_writers_own_error_is_not_the_disks_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), replacing(tmp_path / "m.gguf", "a model") as tmp:
        tmp.write_bytes(b"GGUF")
        raise ZeroDivisionError
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_staged_then_published_and_a_damaged_one_replaced(tmp_path: Path) -> None:
    final = tmp_path / "v1" / "model-seed0"
    final.mkdir(parents=True)
    (final / "stale.gguf").write_bytes(b"damaged")
    with staged_folder(final, "a model", replace_if=lambda f: not (f / "m.gguf").exists()) as staging:
        (staging / "m.gguf").write_bytes(b"GGUF")
    assert sorted(p.name for p in final.iterdir()) == ["m.gguf"]
    assert sorted(p.name for p in final.parent.iterdir()) == ["model-seed0"]


def test_a_folder_published_meanwhile_by_another_process_wins(tmp_path: Path) -> None:
    final = tmp_path / "model"
    with staged_folder(final, "a model") as staging:
        (staging / "m.gguf").write_bytes(b"mine")
        final.mkdir()
        (final / "m.gguf").write_bytes(b"theirs")
    assert (final / "m.gguf").read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_staged_folder_that_fails_for_the_disk_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(FileNotKeptError),
        staged_folder(tmp_path / "model", "a model") as staging,
        open(staging / "m.gguf", "wb") as out,
    ):
        full_disk(out)
    assert list(tmp_path.iterdir()) == []


def test_temporaries_a_killed_writer_left_are_swept_when_old(tmp_path: Path) -> None:
    old = tmp_path / f"{TEMP_PREFIX}a.state.x1"
    young = tmp_path / f"{TEMP_PREFIX}b.state.x2"
    kept = tmp_path / "c.state"
    for p in (old, young, kept):
        p.write_bytes(b"x")
    os.utime(old, (1000, 1000))
    assert sweep_temporaries(tmp_path, 600.0, now=2000.0) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([young.name, kept.name])


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_cache_writer_warns_once_backs_off_and_says_when_it_works_again(tmp_path: Path) -> None:
    lines: list[str] = []
    clock = Clock()
    writes = CacheWrites(lines.append, WriteHealth(first_wait_s=2, max_wait_s=8), clock)
    path = tmp_path / "s.state"
    assert not writes.keep(path, full_disk, "the state after 9 tokens")
    assert len(lines) == 1
    assert (
        str(tmp_path) in lines[0] and "ENOSPC" in lines[0] and "the state after 9 tokens not kept" in lines[0]
    )
    tried: list[int] = []

    def counted(out: IO[Any]) -> None:
        tried.append(1)
        full_disk(out)

    for _ in range(50):  # a token's worth of writes while it waits: none tried
        assert not writes.keep(path, counted, "a state")
    assert tried == []
    waits = []
    for _ in range(4):  # each failed try doubles the wait, capped
        clock.t = writes.health.retry_at
        assert not writes.keep(path, counted, "a state")
        waits.append(writes.health.wait_s)
    assert waits == [4, 8, 8, 8] and len(tried) == 4 and len(lines) == 1
    clock.t = writes.health.retry_at
    assert writes.keep(path, b"whole", "a state")
    assert path.read_bytes() == b"whole"
    assert lines[1] == f"bmoe: writes to {tmp_path} work again (55 not kept meanwhile)"
    assert (
        not writes.keep(path, full_disk, "a state") and len(lines) == 3
    )  # a new run of failures: said again


@given(st.lists(st.tuples(st.sampled_from(["try", "fail", "ok"]), st.floats(0, 50)), max_size=60))
def test_write_health_keeps_its_invariants(ops: list[tuple[str, float]]) -> None:
    health = WriteHealth(first_wait_s=1, max_wait_s=16)
    now = 0.0
    said = 0
    for op, dt in ops:
        now += dt
        if op == "try":
            health.may_try(now)
        elif op == "fail":
            was_failing = health.failing
            line = health.failed(now, "/d", "ENOSPC", "x")
            assert (line is not None) == (not was_failing)
            said += line is not None
        else:
            health.succeeded("/d")
        health.check_valid()
    assert health.warnings == said
