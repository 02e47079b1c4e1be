"""``--csv``'s bmoe_metrics v2 file: rows from progress, the summary as BMOE_DONE's, parsing back."""

from __future__ import annotations

import io

import attrs
import pytest

from bmoe.cli import main as cli_main
from bmoe.cli.live import PlainDisplay
from bmoe.cli.session_loop import done_response, progress_response
from bmoe.domain.generation import Progress, RunResult
from bmoe.domain.metrics import (
    COLUMNS,
    FORMAT_LINE,
    MemorySample,
    MetricsFormatError,
    RunningTotals,
    format_metrics,
    parse_metrics,
    parse_proc_status,
    run_summary,
    token_row,
)
from bmoe.domain.streaming import StreamCounters, StreamReport

STATUS = """Name:\tpython
VmPeak:\t  900000 kB
VmRSS:\t  204800 kB
RssAnon:\t  102400 kB
RssFile:\t   98304 kB
RssShmem:\t    4096 kB
"""

MEM = MemorySample(rss_mib=200.0, rss_anon_mib=100.0, rss_file_mib=96.0)


def _counters(**kw: float) -> StreamCounters:
    return StreamCounters(**kw)  # type: ignore[arg-type]


def _progress(step: int, wall_ms: float, stream: StreamCounters | None) -> Progress:
    return Progress(step=step, steps=4, wall_ms=wall_ms, delta_text="x", delta_reasoning="", stream=stream)


def _result(streamed: bool) -> RunResult:
    report = StreamReport(
        prefill=_counters(hits=1, misses=3, bytes_read=3 << 20, io_s=0.03),
        decode=_counters(
            hits=9, misses=3, bytes_read=5 << 20, io_s=0.012, stall_s=0.006, mgmt_s=0.0003,
            resident_bytes=7 << 19, budget_bytes=4 << 20,
        ),
        decode_steps=3,
        decode_wall_s=0.3,
    )  # fmt: skip
    return RunResult(
        text="abc",
        reasoning="",
        tokens=(5, 6, 7, 8),
        n_prompt=3,
        n_past=7,
        prefill_s=0.25,
        decode_s=0.3,
        stream=report if streamed else None,
    )


def test_proc_status_memory_is_read_in_mib() -> None:
    assert parse_proc_status(STATUS) == MEM


def test_proc_status_without_the_lines_is_not_measured() -> None:
    assert parse_proc_status("Name:\tx\n") == MemorySample(-1.0, -1.0, -1.0)


def test_a_streamed_row_splits_the_time_as_bmoe_progress_does() -> None:
    stream = _counters(hits=3, misses=1, bytes_read=4096, io_s=0.004, stall_s=0.002, mgmt_s=0.001,
                       prefetch_issued=5, prefetch_hits=2)  # fmt: skip
    p = _progress(2, 10.0, stream)
    row = token_row(p, MEM)
    wire = progress_response(p)
    assert (row.io_ms, row.compute_ms, row.stall_ms, row.mgmt_ms, row.cache_hit_pct) == (
        wire.io_ms, wire.compute_ms, wire.stall_ms, wire.mgmt_ms, wire.cache_hit_pct,
    )  # fmt: skip
    assert row.read_bytes == 4096
    assert (row.prefetch_issued, row.prefetch_hits) == (5, 2)
    assert (row.rss_mib, row.rss_anon_mib, row.rss_file_mib) == (200.0, 100.0, 96.0)


def test_a_resident_row_marks_the_streaming_figures_not_measured() -> None:
    row = token_row(_progress(1, 3.0, None), MEM)
    assert row.io_ms == row.stall_ms == row.cache_hit_pct == -1.0
    assert row.read_bytes == -1 and row.wall_ms == 3.0


@pytest.mark.parametrize("streamed", [True, False])
def test_the_summary_equals_bmoe_done(streamed: bool) -> None:
    result = _result(streamed)
    done = attrs.asdict(done_response("r", result, load_s=1.5))
    for key in ("id", "text", "reasoning", "tool_calls", "logprobs"):
        del done[key]
    assert run_summary(result, 1.5) == done


@pytest.mark.parametrize("streamed", [True, False])
def test_a_file_parses_back_to_its_figures(streamed: bool) -> None:
    result = _result(streamed)
    stream = _counters(hits=1, misses=1, bytes_read=1 << 20, io_s=0.001) if streamed else None
    rows = [token_row(_progress(i, 10.0 + i / 3, stream), MEM) for i in range(1, 5)]
    config = {"model": "/m/a b.gguf", "arch": "qwen3moe", "odirect": True, "note": "two\nlines"}
    text = format_metrics(config, rows, run_summary(result, 2.0))
    assert text.startswith(FORMAT_LINE + "\n")
    parsed = parse_metrics(text)
    assert parsed.config == {**config, "odirect": "true"}
    assert parsed.columns == COLUMNS
    assert parsed.column("step") == [1.0, 2.0, 3.0, 4.0]
    assert parsed.column("wall_ms")[0] == pytest.approx(10.3333, abs=1e-4)
    summary = run_summary(result, 2.0)
    for key, value in summary.items():
        assert parsed.summary_float(key) == float(value), key  # exact: floats are written with repr


def test_columns_are_read_by_name_whatever_their_order() -> None:
    text = f"{FORMAT_LINE}\n# arch=x\nwall_ms,extra,step\n5,9,1\n7,9,2\n# summary\n# tokens=2\n"
    parsed = parse_metrics(text)
    assert parsed.column("step") == [1.0, 2.0]
    assert parsed.column("wall_ms") == [5.0, 7.0]
    assert parsed.summary == {"tokens": "2"}
    with pytest.raises(KeyError):
        parsed.column("io_ms")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("step,wall_ms\n1,2\n", "line 1"),
        (f"{FORMAT_LINE}\n# arch=x\n", "no header row"),
        (f"{FORMAT_LINE}\nstep,io_ms\n1,2\n", "wall_ms"),
        (f"{FORMAT_LINE}\nstep,wall_ms\n1\n", "row 1"),
        (f"{FORMAT_LINE}\nstep,wall_ms\n1,abc\n", "row 1"),
        (f"{FORMAT_LINE}\nstep,wall_ms\n# summary\n1,2\n", "after '# summary'"),
        (f"{FORMAT_LINE}\n# no equals sign\nstep,wall_ms\n", "line 2"),
    ],
)
def test_a_malformed_file_is_refused_saying_where(text: str, message: str) -> None:
    with pytest.raises(MetricsFormatError, match=message):
        parse_metrics(text)


def test_running_totals_leave_the_first_token_out_of_the_rate() -> None:
    totals = RunningTotals()
    totals.add(_progress(1, 900.0, _counters()))
    totals.add(_progress(2, 250.0, _counters(hits=3, misses=1, bytes_read=1 << 20)))
    totals.add(_progress(3, 250.0, _counters(hits=1, misses=3, bytes_read=1 << 20)))
    assert totals.tok_s == pytest.approx(4.0)
    assert totals.hit_pct == pytest.approx(50.0)
    assert totals.line() == "progress: 3/4 tokens, 4.0 tok/s, 50.0% hit, 2.0 MiB read"


def test_running_totals_of_a_resident_run_show_no_streaming_figures() -> None:
    totals = RunningTotals()
    totals.add(_progress(1, 5.0, None))
    assert totals.line() == "progress: 1/4 tokens, 0.0 tok/s"


def test_plain_display_writes_a_line_a_second_and_the_last_one_on_close() -> None:
    now = [0.0]
    out = io.StringIO()
    display = PlainDisplay(out, every=1.0, clock=lambda: now[0])
    for step in range(1, 5):
        now[0] += 0.6
        display.update(_progress(step, 600.0, None))
    display.close()
    lines = out.getvalue().splitlines()
    assert lines == ["progress: 2/4 tokens, 1.7 tok/s", "progress: 4/4 tokens, 1.7 tok/s"]


@pytest.mark.parametrize("other", [["--session"], ["--ppl", "text.txt"]])
def test_csv_is_refused_outside_one_shot_generation(
    other: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["--csv", "m.csv", *other])
    assert exit_.value.code == 2
    assert "--csv is for one-shot generation" in capsys.readouterr().err
