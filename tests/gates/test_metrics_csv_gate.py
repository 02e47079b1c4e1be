"""``--csv`` and ``--progress`` on a real streamed run, then ``python -m bmoe.report`` on its file."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bmoe.domain.metrics import COLUMNS, parse_metrics
from bmoe.domain.streaming import MIB

TinyModel = Callable[[str], Path]


def test_a_streamed_run_writes_its_metrics_and_the_report_draws_them(
    tiny_model_path: TinyModel, tmp_path: Path
) -> None:
    csv, png = tmp_path / "run.csv", tmp_path / "run.png"
    run = subprocess.run(
        [sys.executable, "-m", "bmoe.cli", "-m", str(tiny_model_path("qwen3moe")), "--moe-stream",
         "--cache-mb", "1", "-n", "8", "--csv", str(csv), "--progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    m = parse_metrics(csv.read_text())
    assert m.columns == COLUMNS
    assert m.config["arch"] == "qwen3moe" and m.config["streaming"] == "true"
    assert m.config["cache_budget_mib"] == "1.0" and m.config["n_expert"] == "8"
    n = int(m.summary["tokens"])
    assert n == len(m.rows) > 1
    assert m.column("step") == [float(i) for i in range(1, n + 1)]
    assert f"generation: {n} tokens" in run.stderr
    # stderr is not a terminal here: plain progress lines, the last one at the end
    progress = [line for line in run.stderr.splitlines() if line.startswith("progress: ")]
    assert progress and progress[-1].startswith(f"progress: {n}/8 tokens")
    # the decode tokens' rows add up to the run's decode figures
    decode = [r for r in m.rows if r["step"] > 1]
    assert sum(r["read_bytes"] for r in decode) / MIB == m.summary_float("read_mib")
    assert all(0 <= r["cache_hit_pct"] <= 100 for r in decode)
    assert all(r["rss_mib"] > 0 and r["rss_anon_mib"] > 0 for r in m.rows)
    report = subprocess.run(
        [sys.executable, "-m", "bmoe.report", str(csv), "-o", str(png)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert f"tokens: {n}," in report.stdout and "decode: " in report.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
