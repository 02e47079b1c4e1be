"""``python -m bmoe.plan --verify`` end to end on the built-in model: the plan's flags run by
the bench in a process of their own, predicted printed beside measured for every figure, the
knee named, what was measured kept in bmoe's cache folder, and the next plan of the same
model predicting from it (its hit rate "measured here", its CPU a MiB read from the run).
Nothing here is timed against a bar: the figures are compared with the plan's own ranges
by the command, and the gate checks that each was printed and kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bmoe.adapters.cache_dirs import fixture_dir
from bmoe.adapters.plan_runs_file import read_runs
from bmoe.domain.plan.hit_guesses import MEASURED


def _plan(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # a cache folder of its own, the generated models where they are
    env = {**os.environ, "BMOE_CACHE_DIR": str(cache), "BMOE_FIXTURE_DIR": str(fixture_dir())}
    argv = [sys.executable, "-m", "bmoe.plan", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)


def test_verify_prints_each_figure_beside_its_prediction_and_the_next_plan_predicts_from_it(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    done = _plan(cache, "--verify", "--knee", "--prompt-tokens", "64", "-c", "512")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for figure in ("hit rate", "MiB a token", "decode tok/s", "prefill 64"):
        assert figure in out, out
    assert "knee: --cache-mb" in out and "kept: " in out
    (kept,) = (cache / "plan-runs").glob("*.json")
    (run,) = read_runs(kept)
    assert run.tok_s > 0 and 0 <= run.hit_rate <= 1 and run.prefill_tokens == 64
    assert run.where == "no memory limit, the disk as it is"
    again = _plan(cache, "-c", "512", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    doc = json.loads(again.stdout)["streamed"]
    assert doc["expected_guess"] == MEASURED
    assert doc["cpu_source"] == "measured here (bmoe.plan --verify)"
    assert MEASURED in [g["name"] for g in doc["hit_guesses"]]
