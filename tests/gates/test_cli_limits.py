"""Absurd settings are refused with one clear message and a non-zero exit, never a crash
(``-t 100000`` used to segfault inside llama.cpp's thread pool)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["-t", "100000"], "n_threads must be between 1 and 512"),
    (["-t", "0"], "n_threads must be between 1 and 512"),
    (["-c", "100000000"], "could not create a context of 100000000 tokens"),
    (["-c", "4"], "n_ctx must be at least 8"),
    (["-b", "0"], "the prompt batch must be at least 1 token"),
    (["-n", "-5"], "n_predict must be >= 0"),
    (["--moe-stream", "--io-threads", "0"], "io_threads must be >= 1"),
    (["--moe-stream", "--prefetch", "-1"], "prefetch must be >= 0"),
    (["--moe-stream", "--cache-mb", "0", "--prefetch", "1"], "--prefetch needs the cache"),
    (["--n-expert-used", "100"], "between 1 and the model's 8 experts"),
    (["--temp", "-1"], "temp must be >= 0"),
    (["--top-p", "5"], "top_p must be in [0, 1]"),
    (["--seed", "-1"], "seed must be >= 0"),
    (["-ctv", "q8_0"], "--cache-type-v q8_0 needs flash attention"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_an_absurd_setting_is_one_clear_error(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe.cli", "-p", "hi", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("bmoe: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
