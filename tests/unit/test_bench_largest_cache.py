"""The search for the largest ``--cache-mb`` that runs in a memory limit: auto first, then a
bisection between the largest budget that ran (auto's own among them) and the smallest that
failed, down to 32 MiB; the report says both budgets and their ratio."""

from __future__ import annotations

from bmoe.bench.largest_cache import STEP_MIB, Search, Try, find


class Machine:
    """A scripted machine: any budget up to ``fits_below`` runs; auto takes ``auto_budget``;
    ``asked``: the budgets tried, in order."""

    def __init__(self, fits_below: int, auto_budget: int) -> None:
        self.fits_below, self.auto_budget = fits_below, auto_budget
        self.asked: list[int | None] = []

    def try_budget(self, cache_mib: int | None) -> Try:
        self.asked.append(cache_mib)
        if cache_mib is None:  # auto starts 300 MiB higher, and holds itself after the prompt
            ran = self.auto_budget <= self.fits_below
            return Try(None, ran=ran, budget_mib=self.auto_budget, start_mib=self.auto_budget + 300)
        if cache_mib <= self.fits_below:
            return Try(cache_mib, ran=True, budget_mib=cache_mib)
        return Try(cache_mib, ran=False, error="OOM killed in the memory group")


def test_the_bisection_brackets_the_largest_budget_that_runs() -> None:
    m = Machine(fits_below=1700, auto_budget=1641)
    search = find(m.try_budget, 2048)
    assert m.asked[:3] == [None, 1641, (1641 + 2048) // 2]  # auto, its decoding budget given, bisect
    assert search.largest_ran is not None and search.smallest_failed is not None
    assert search.largest_ran <= 1700 < search.smallest_failed
    assert search.smallest_failed - search.largest_ran <= STEP_MIB
    assert search.ratio() is not None and 0.9 < search.ratio() <= 1.0  # type: ignore[operator]
    assert "auto: 1,641 MiB decoding (from 1,941 at start); the largest that ran:" in search.text()


def test_an_auto_budget_that_fails_is_said_so() -> None:
    search = find(Machine(fits_below=500, auto_budget=900).try_budget, 2048)
    assert search.ratio() is None and search.largest_ran is not None and search.largest_ran <= 500
    assert search.text().splitlines()[-1].startswith("auto: did not run; the largest that ran:")
    assert "| auto | no | 1,200 | 900 |" in search.text()


def test_a_try_reads_the_childs_answer_and_the_groups_peak() -> None:
    info = {"budget_bytes": 1536 << 20, "budget_end_bytes": 1500 << 20}
    ran = Try.of(1536, {"tok_s": 5.0, "stream_info": info, "group": {"peak_bytes": 2000 << 20}})
    assert ran == Try(1536, True, 1500, 2000.0, None, 1536)
    killed = Try.of(1800, {"error": "OOM killed", "group": {"peak_bytes": 2048 << 20}})
    assert not killed.ran and killed.error == "OOM killed"
    assert Search(2048, (ran,)).next_budget() == (1536 + 2048) // 2
