"""``python -m bmoe.report``: the text summary and the chart of a bmoe_metrics v2 file."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from bmoe.cli.live import PlainDisplay, make_display
from bmoe.domain.generation import Progress, RunResult
from bmoe.domain.metrics import MemorySample, format_metrics, parse_metrics, run_summary, token_row
from bmoe.domain.streaming import StreamCounters, StreamReport
from bmoe.report.__main__ import main
from bmoe.report.text import summary_text

CONFIG = {
    "model": "/m/tiny.gguf", "arch": "qwen3moe", "n_expert": 8, "n_expert_used": 2, "streaming": True,
    "cache_budget_mib": 64.0, "lanes": 4, "odirect": True, "prefetch": 1, "policy": "fast",
    "prompt_batch": 512, "threads": 2,
}  # fmt: skip


def _text(streamed: bool) -> str:
    c = StreamCounters(hits=3, misses=1, bytes_read=2 << 20, stall_s=0.01, mgmt_s=0.001)
    rows = [
        token_row(
            Progress(step=i, steps=5, wall_ms=100.0 * i, delta_text="", delta_reasoning="",
                     stream=c if streamed else None),
            MemorySample(100.0 + i, 50.0 + i, 40.0),
        )
        for i in range(1, 6)
    ]  # fmt: skip
    report = StreamReport(prefill=c, decode=c, decode_steps=4, decode_wall_s=1.4)
    result = RunResult("t", "", (1, 2, 3, 4, 5), 3, 8, 0.5, 1.4, stream=report if streamed else None)
    config = CONFIG if streamed else {**CONFIG, "streaming": False}
    return format_metrics(config, rows, run_summary(result, 1.0))


def test_the_summary_of_a_streamed_run() -> None:
    text = summary_text(parse_metrics(_text(True)))
    assert "model: /m/tiny.gguf (qwen3moe, 8 experts, top-2)" in text
    assert "mode: expert streaming, cache 64 MiB, 4 lanes, O_DIRECT, prefetch 1;" in text
    assert "tokens: 5, 2.86 tok/s; prefill 3 tokens in 0.500 s" in text
    assert "per token: median 350.0 ms" in text and "max 500.0 ms (4 decode tokens)" in text
    assert "decode: 75.0% hit, 2.0 MiB read" in text
    assert "waiting for reads 2.50 ms" in text
    assert "memory: peak RSS 105.0 MiB (anonymous 55.0 MiB)" in text


def test_the_summary_of_a_resident_run_has_no_streaming_line() -> None:
    text = summary_text(parse_metrics(_text(False)))
    assert "mode: resident;" in text
    assert "decode:" not in text


@pytest.mark.parametrize("streamed", [True, False])
def test_the_report_writes_a_png(tmp_path: Path, streamed: bool, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    csv = tmp_path / "run.csv"
    csv.write_text(_text(streamed))
    assert main([str(csv)]) == 0
    png = tmp_path / "run.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chart: {png}" in capsys.readouterr().out


def test_a_file_that_is_not_metrics_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "other.csv"
    csv.write_text("a,b\n1,2\n")
    assert main([str(csv), "--no-chart"]) == 1
    assert "not a bmoe metrics file" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.csv")]) == 1


def test_without_matplotlib_the_report_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    csv = tmp_path / "run.csv"
    csv.write_text(_text(True))
    assert main([str(csv)]) == 1
    out = capsys.readouterr()
    assert "tokens: 5" in out.out
    assert "matplotlib is missing (.venv/bin/pip install -e '.[bench]' (from a checkout of bmoe))" in out.err
    assert not (tmp_path / "run.png").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_rich_the_live_display_is_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    display = make_display()
    assert isinstance(display, PlainDisplay)
    display.update(Progress(step=1, steps=2, wall_ms=1.0, delta_text="", delta_reasoning=""))
    display.close()
    assert term.getvalue() == "progress: 1/2 tokens, 0.0 tok/s\n"
