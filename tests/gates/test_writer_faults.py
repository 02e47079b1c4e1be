"""Each of bmoe's writers under an injected disk fault (``tests/disk_faults.c``, preloaded):
``open`` for writing, ``write``, ``fsync`` and ``rename`` failing with ``ENOSPC``, ``EROFS``,
``EACCES`` and ``EIO`` in the writer's folder. Whatever fails, nothing stands under the
file's final name but what stood there before, no temporary file is left, and the failure
is what the writer promises: a cache's writer (prompt states, the usage profile, the AMX
verdict) goes on with one warning line; a writer the run needs (the built-in model) raises
``FileNotKeptError`` naming the folder.

A writer that bypassed the rule (wrote its file in place, or renamed without ``fsync``)
fails the ``fsync`` and ``rename`` cases: its file would be kept. Reading back: a state file
whose read fails (``EIO``) is refused by name, removed, and is a cache miss.

One child process per writer runs all its cases (the preload reads its settings at each
call, so the child turns the faults on and off between cases).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from disk_faults import fault_env

OPS = ("open", "write", "fsync", "rename")
ERRNOS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS, "EACCES": errno.EACCES, "EIO": errno.EIO}
CASES = [(op, name) for op in OPS for name in ERRNOS]

CHILD = r"""
import json, os, sys, traceback
from pathlib import Path
base = Path(sys.argv[1])
cases = json.loads(sys.argv[2])
writer = sys.argv[3]

def files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())

def faults(op, code):
    os.environ["BMOE_FAULT_OPS"] = op
    os.environ["BMOE_FAULT_ERRNO"] = str(code)

def off():
    os.environ["BMOE_FAULT_OPS"] = ""

out = []
for i, (op, code) in enumerate(cases):
    folder = base / f"case{i}"
    folder.mkdir()
    lines = []
    result = {"op": op, "errno": code}
    try:
        if writer == "state":
            import numpy as np
            from bmoe.adapters.state_files import StateFiles, state_identity
            states = StateFiles(folder, state_identity("m", ("x",)), 1 << 30, lines.append)
            states.put((1, 2, 3), np.full(100, 7, dtype=np.uint8))  # before: kept
            faults(op, code)
            states.put((1, 2, 3, 4), np.full(100, 8, dtype=np.uint8))
            states.put((1, 2, 3, 4, 5), np.full(100, 9, dtype=np.uint8))  # backing off: not tried
            off()
            result["held"] = [list(t) for t in states.held()]
        elif writer == "state-read":
            import numpy as np
            from bmoe.adapters.state_files import StateFiles, state_identity
            states = StateFiles(folder, state_identity("m", ("x",)), 1 << 30, lines.append)
            states.put((1, 2, 3), np.full(100, 7, dtype=np.uint8))
            faults(op, code)
            got = states.take((1, 2, 3))
            off()
            result["taken"] = got is not None
            result["held"] = [list(t) for t in states.held()]
        elif writer == "profile":
            from bmoe.adapters.usage_profile_file import update_profile
            from bmoe.domain.streaming.usage_profile import merge
            path = folder / "p.json"
            update_profile(path, "k" * 24, 2, 4, lambda p: p)  # before: kept
            before = path.read_bytes()
            faults(op, code)
            try:
                update_profile(path, "k" * 24, 2, 4, lambda p: merge(p, [1] * 8, 4.0, new_session=True))
            finally:
                off()
                result["unchanged"] = path.read_bytes() == before
        elif writer == "verdict":
            from bmoe.adapters.cpu_features import probe_amx
            from bmoe.domain.cpu_features import AmxVerdict
            os.environ["BMOE_CACHE_DIR"] = str(folder)
            faults(op, code)
            try:
                probe_amx(cached=False, tiles=AmxVerdict(usable=False, why="pretend"))
            finally:
                off()
        elif writer == "model":
            os.environ["BMOE_FIXTURE_DIR"] = str(folder)
            from bmoe.tinymodel.default import default_model_path
            faults(op, code)
            try:
                default_model_path()
            finally:
                off()
        result["raised"] = None
    except Exception as exc:
        off()
        result["raised"] = type(exc).__name__
        result["message"] = str(exc)
        result["trace"] = traceback.format_exc()[-800:]
    result["lines"] = lines
    result["files"] = files(folder)
    out.append(result)
print(json.dumps(out))
"""


def run_writer(tmp_path: Path, writer: str, cases: list[tuple[str, int]]) -> list[dict[str, Any]]:
    env = fault_env(tmp_path, "", 0)
    env.pop("BMOE_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), json.dumps(cases), writer],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(json.loads(proc.stdout.splitlines()[-1]))


def cases() -> list[tuple[str, int]]:
    return [(op, ERRNOS[name]) for op, name in CASES]


def no_temporaries(files: list[str]) -> bool:
    return not any(".bmoe-tmp-" in f for f in files)


def test_a_state_the_disk_cannot_keep_is_one_warning_and_never_a_file(tmp_path: Path) -> None:
    for r in run_writer(tmp_path, "state", cases()):
        case = f"{r['op']} {errno.errorcode[r['errno']]}"
        assert r["raised"] is None, (case, r.get("trace"))
        assert r["held"] == [[1, 2, 3]], case  # the state from before, and nothing else
        assert len(r["files"]) == 1 and r["files"][0].endswith(".state"), (case, r["files"])
        assert len(r["lines"]) == 1, (case, r["lines"])
        assert "cannot write to" in r["lines"][0] and errno.errorcode[r["errno"]] in r["lines"][0], case
        assert "the state after 4 tokens" in r["lines"][0], case


def test_a_state_file_that_cannot_be_read_is_refused_by_name_and_a_miss(tmp_path: Path) -> None:
    for r in run_writer(tmp_path, "state-read", [("read", errno.EIO), ("openr", errno.EIO)]):
        assert r["raised"] is None, r.get("trace")
        assert r["taken"] is False and r["held"] == []
        assert r["files"] == [], r["files"]  # removed: bmoe's own
        assert len(r["lines"]) == 1 and "refused" in r["lines"][0] and ".state" in r["lines"][0]
        assert "Input/output error" in r["lines"][0], r["lines"]


def test_a_usage_profile_the_disk_cannot_keep_leaves_the_old_one(tmp_path: Path) -> None:
    for r in run_writer(tmp_path, "profile", cases()):
        case = f"{r['op']} {errno.errorcode[r['errno']]}"
        assert r["raised"] == "FileNotKeptError", (case, r.get("trace"))
        assert str(tmp_path) in r["message"] and errno.errorcode[r["errno"]] in r["message"], case
        assert r["unchanged"], case
        assert sorted(r["files"]) == ["p.json", "p.json.lock"], (case, r["files"])


def test_an_amx_verdict_the_disk_cannot_keep_is_probed_again_next_time(tmp_path: Path) -> None:
    for r in run_writer(tmp_path, "verdict", cases()):
        case = f"{r['op']} {errno.errorcode[r['errno']]}"
        assert r["raised"] is None, (case, r.get("trace"))
        assert r["files"] == [], (case, r["files"])


def test_the_built_in_model_the_disk_cannot_keep_is_a_clear_error_and_no_file(tmp_path: Path) -> None:
    picked = [("open", errno.ENOSPC), ("write", errno.ENOSPC), ("fsync", errno.EIO), ("rename", errno.EROFS)]
    for r in run_writer(tmp_path, "model", picked):
        case = f"{r['op']} {errno.errorcode[r['errno']]}"
        assert r["raised"] == "FileNotKeptError", (case, r.get("trace"))
        assert "the model qwen3moe" in r["message"] and str(tmp_path) in r["message"], case
        assert not any(f.endswith(".gguf") for f in r["files"]), (case, r["files"])
        assert no_temporaries(r["files"]), (case, r["files"])


@pytest.mark.parametrize("op", ["write", "fsync", "rename"])
def test_the_fault_injector_itself_fails_a_plain_write(tmp_path: Path, op: str) -> None:
    """The preload does fail what it says (else every case above would pass for nothing)."""
    code = (
        "import os,sys; f=open(sys.argv[1],'wb'); f.write(b'x'); f.flush(); os.fsync(f.fileno()); f.close(); "
    )
    code += "os.rename(sys.argv[1], sys.argv[1]+'.b')"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "f")],
        env=fault_env(tmp_path, op, errno.ENOSPC),
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "No space left on device" in proc.stderr, proc.stderr
    assert os.environ.get("LD_PRELOAD", "") == "" or "disk-faults" not in os.environ["LD_PRELOAD"]
