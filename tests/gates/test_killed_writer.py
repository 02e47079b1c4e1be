"""A writer killed with SIGKILL in the middle of its state files, many times
(``BMOE_KILL_WRITES``, 200 by default): the next start never loads a torn file. Every file
under a state's name is whole (it reads back bit for bit, nothing refused), the temporary
files the kills left are never taken for states, and old ones are swept at start.

The writer is a forked child of this process (forking is cheap, so 200 kills take seconds)
writing states of 256 KiB to 2 MiB in a loop; each is killed after a random few
milliseconds, mostly in the middle of a write, an fsync or a rename.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import numpy as np

from bmoe.adapters.file_writes import TEMP_PREFIX
from bmoe.adapters.state_files import StateFiles, state_identity

KILLS = int(os.environ.get("BMOE_KILL_WRITES", "200"))
IDENTITY = state_identity("killed-writer", ("x",))


def state(tokens: tuple[int, ...]) -> np.ndarray:
    """The state a conversation's tokens always get (so a file can be checked whole)."""
    n = 256 * 1024 + (tokens[-1] % 8) * 224 * 1024
    return np.random.default_rng(tokens[-1]).integers(0, 256, n, dtype=np.uint8)


def writer(root: Path, seed: int) -> None:
    """The child: write states until killed."""
    files = StateFiles(root, IDENTITY, 1 << 40)
    rng = random.Random(seed)
    while True:
        tokens = (1, 2, rng.randrange(64))
        files.put(tokens, state(tokens))


def test_no_torn_state_file_is_ever_loaded_after_kills(tmp_path: Path) -> None:
    rng = random.Random(0)
    killed_mid_write = 0
    for i in range(KILLS):
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            try:
                writer(tmp_path, i)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.002, 0.02))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        folder = tmp_path / IDENTITY
        killed_mid_write += (
            any(p.name.startswith(TEMP_PREFIX) for p in folder.iterdir()) if folder.exists() else 0
        )
    lines: list[str] = []
    files = StateFiles(tmp_path, IDENTITY, 1 << 40, lines.append)  # the next start
    held = files.held()
    assert held, "no state was ever written: the kills came too early to test anything"
    for tokens in held:
        blob = files.take(tokens)
        assert blob is not None, (tokens, lines)
        assert bytes(blob) == bytes(state(tokens)), tokens
    assert files.refused == 0 and not lines, lines
    assert killed_mid_write > 0, "no kill landed in the middle of a write"
    # the temporaries the kills left: never states; swept once old
    left = [p for p in (tmp_path / IDENTITY).iterdir() if p.name.startswith(TEMP_PREFIX)]
    for p in left:
        os.utime(p, (0, 0))
    StateFiles(tmp_path, IDENTITY, 1 << 40)
    assert not [p for p in (tmp_path / IDENTITY).iterdir() if p.name.startswith(TEMP_PREFIX)]
