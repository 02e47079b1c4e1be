"""The AMX kernel probe's decision, from what its child reported (``bmoe.domain.amx_kernel``):
a pure function, driven here with the reports of every way the child can end."""

from __future__ import annotations

from bmoe.domain.amx_kernel import (
    MAX_RELATIVE_ERROR,
    KernelReport,
    KernelRun,
    event_line,
    kernel_verdict,
    read_report,
)
from bmoe.domain.cpu_features import AmxVerdict, choose_amx

TILES = AmxVerdict(True, "the tile instructions ran and multiplied right")
PLACED = event_line("placed", model="Q4_0", amx_bytes=167772)


def run(model: str = "Q4_0", threads: int = 1, error: float = 1e-3, same: bool = True) -> str:
    return event_line("run", model=model, threads=threads, relative_error=error, same_tokens=same)


def computing(model: str = "Q4_0", threads: int = 1) -> str:
    return event_line("computing", model=model, threads=threads)


def test_a_child_that_computed_every_batch_right_says_yes_naming_what_ran() -> None:
    lines = [
        PLACED,
        computing(),
        run(),
        computing(threads=3),
        run(threads=3),
        computing(threads=2),
        run(threads=2),
    ]
    verdict = kernel_verdict(read_report(lines), TILES)
    assert verdict.usable
    assert verdict.why == f"llama.cpp's AMX kernel computed Q4_0 right with 1, 2, 3 threads; {TILES.why}"


def test_a_child_killed_by_a_signal_says_no_naming_the_signal_and_the_step() -> None:
    lines = [PLACED, computing(), run(), computing(threads=3)]
    verdict = kernel_verdict(read_report(lines, signal="SIGILL"), TILES)
    assert not verdict.usable
    assert verdict.why == (
        "llama.cpp's AMX kernel faulted in the probe (SIGILL with Q4_0, 3 threads; "
        "the tile instructions alone ran right)"
    )


def test_a_signal_before_any_computing_step_is_still_a_fault() -> None:
    verdict = kernel_verdict(read_report([], signal="SIGSEGV"), TILES)
    assert not verdict.usable and "faulted in the probe (SIGSEGV;" in verdict.why


def test_a_torn_last_line_is_ignored() -> None:
    lines = [PLACED, computing(), run(), computing(threads=3), '{"event": "ru']
    report = read_report(lines, signal="SIGSEGV")
    assert report.at == "Q4_0, 3 threads" and len(report.runs) == 1


def test_wrong_logits_say_no_with_the_error() -> None:
    lines = [PLACED, computing(), run(error=0.9)]
    verdict = kernel_verdict(read_report(lines), TILES)
    assert not verdict.usable
    assert verdict.why == "llama.cpp's AMX kernel computed wrong logits (Q4_0, 1 threads: relative error 0.9)"


def test_other_tokens_say_no_even_with_a_small_error() -> None:
    verdict = kernel_verdict(read_report([PLACED, run(error=1e-4, same=False)]), TILES)
    assert not verdict.usable and "other tokens" in verdict.why


def test_the_tolerance_is_inclusive() -> None:
    assert KernelRun("Q4_0", 1, MAX_RELATIVE_ERROR, True).right
    assert not KernelRun("Q4_0", 1, MAX_RELATIVE_ERROR * 1.01, True).right


def test_a_hang_an_exit_status_and_nothing_computed_each_say_no() -> None:
    hung = kernel_verdict(read_report([PLACED, computing()], timed_out=True), TILES)
    assert not hung.usable and "did not finish in the probe's time (Q4_0, 1 thread)" in hung.why
    lines = [PLACED, event_line("error", message="ModelLoadError: no")]
    failed = kernel_verdict(read_report(lines, status=1), TILES)
    assert not failed.usable and failed.why.endswith("(exit status 1): ModelLoadError: no")
    assert not kernel_verdict(read_report([PLACED]), TILES).usable


def test_a_model_with_no_weight_in_amx_leaves_the_kernel_untested_and_says_no() -> None:
    lines = [event_line("placed", model="Q4_0", amx_bytes=0), run()]
    verdict = kernel_verdict(read_report(lines), TILES)
    assert not verdict.usable and "placed no weight" in verdict.why


def test_tiles_that_fault_decide_before_the_kernel() -> None:
    tiles = AmxVerdict(False, "the tile instructions fault on this CPU (SIGILL in the probe)")
    assert kernel_verdict(KernelReport(), tiles) == tiles


def test_the_refusal_reads_as_one_line_on_the_mode_line() -> None:
    verdict = kernel_verdict(read_report([PLACED, computing()], signal="SIGILL"), TILES)
    choice = choose_amx("auto", True, lambda: verdict)
    assert choice.refused == ("AMX",)
    assert choice.note.startswith("AMX refused: llama.cpp's AMX kernel faulted in the probe (SIGILL")


def test_a_fault_where_the_tiles_were_not_run_says_so_instead_of_that_they_ran() -> None:
    pretended = AmxVerdict(True, "the tiles were not run (BMOE_AMX_PRETEND_OFFERED=1)")
    verdict = kernel_verdict(read_report([PLACED, computing()], signal="SIGILL"), pretended)
    assert verdict.why.endswith(
        "(SIGILL with Q4_0, 1 thread; the tiles were not run (BMOE_AMX_PRETEND_OFFERED=1))"
    )
