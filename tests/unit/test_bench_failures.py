"""A configuration whose child fails is a row saying how, and the bench goes on: a signal is
named ("crashed (SIGSEGV), see LOG"), stock's crash is said to be stock's own."""

from __future__ import annotations

from pathlib import Path

from bmoe.bench.runner import failure_text
from bmoe.domain.crash import CRASH_PREFIX

LOG = Path("out/logs/stock-round1.log")


def test_a_stock_child_killed_by_a_signal_says_stock_llama_cpp_crashed() -> None:
    text = failure_text({"kind": "stock"}, -11, "whatever\n", log_path=LOG)
    assert text == f"crashed (SIGSEGV), see {LOG}: stock llama.cpp itself crashed on this machine"


def test_a_bmoe_child_killed_by_a_signal_quotes_its_crash_line() -> None:
    line = f"{CRASH_PREFIX}SIGILL while running m.gguf (weights in AMX); --amx off avoids it"
    text = failure_text({"kind": "stream"}, -4, f"loading\n{line}\nFatal Python error\n")
    assert text == f"crashed (SIGILL): {line}"


def test_other_failures_keep_their_exit_status_and_last_lines() -> None:
    assert failure_text({"kind": "bmoe"}, 1, "a\nb\nc\nd\n") == "exit status 1: b / c / d"
    oom = failure_text({"kind": "bmoe"}, -9, "", oom=True)
    assert oom == "exit status -9 (OOM-killed in the memory group)"
    late = failure_text({}, -9, "", timed_out=True, timeout_s=5, log_path=LOG)
    assert late == f"timed out after 5 s, see {LOG}"
