"""``python -m bmoe.bench --find-cache-mb``: the largest ``--cache-mb`` that runs in a memory
limit, beside the budget ``--cache-mb auto`` takes there.

Each try is one configuration's process in the memory group of ``--mem-limit-mb`` (as the
bench's rounds are): it loads the model streamed, prefills ``--prompt-tokens`` of the text
(a long prompt: 2,048 by default here, the largest transient a run takes) and decodes
``--tokens`` after it, teacher-forced. A try runs when the child answers and the group saw no
OOM kill; anything else (killed, failed, timed out) is a budget too large. First the default
(``auto``: its budget at start, and the one it decoded with once the prompt gave the room
back, which may be less: ``prefill_memory.budget_held_to_room``), then that decoding budget
given as ``--cache-mb``, then a bisection between the largest given budget that ran and the
smallest that failed, down to ``STEP_MIB``. The answer: auto's decoding budget, the largest
that ran, and their ratio (the issue's bar: auto at least 0.9x the largest).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from bmoe.bench.disk import MIB

STEP_MIB = 32  # the bisection stops when the bracket is this narrow
FIND_PROMPT_TOKENS = 2048


@attrs.frozen
class Try:
    """One budget tried (``cache_mib`` None: auto): whether it ran, the budget the session took,
    the group's peak, and the error of a failed try."""

    cache_mib: int | None
    ran: bool
    budget_mib: int | None = None  # the budget it decoded with (auto: after the prompt)
    group_peak_mib: float | None = None
    error: str | None = None
    start_mib: int | None = None  # the budget at start (auto's arithmetic)

    @classmethod
    def of(cls, cache_mib: int | None, result: dict[str, Any]) -> Try:
        info = result.get("stream_info") or {}
        peak = (result.get("group") or {}).get("peak_bytes")
        end = info.get("budget_end_bytes", info.get("budget_bytes"))
        return cls(
            cache_mib=cache_mib,
            ran="tok_s" in result and not result.get("error"),
            budget_mib=None if end is None else end // MIB,
            group_peak_mib=None if peak is None else peak / MIB,
            error=result.get("error"),
            start_mib=info["budget_bytes"] // MIB if "budget_bytes" in info else None,
        )


@attrs.frozen
class Search:
    """The tries in order, the auto try, and the bracket they left."""

    limit_mib: int
    tries: tuple[Try, ...]

    @property
    def auto(self) -> Try | None:
        return next((t for t in self.tries if t.cache_mib is None), None)

    @property
    def largest_ran(self) -> int | None:
        ran = [t.cache_mib for t in self.tries if t.ran and t.cache_mib is not None]
        return max(ran) if ran else None

    @property
    def smallest_failed(self) -> int | None:
        failed = [t.cache_mib for t in self.tries if not t.ran and t.cache_mib is not None]
        return min(failed) if failed else None

    def next_budget(self) -> int | None:
        """The next budget to try (the bracket's middle), None when it is narrow enough."""
        low = self.largest_ran or 0
        high = self.smallest_failed if self.smallest_failed is not None else self.limit_mib
        if high - low <= STEP_MIB:
            return None
        return (low + high) // 2

    def ratio(self) -> float | None:
        """auto's budget over the largest that ran (None where either is unknown)."""
        auto, largest = self.auto, self.largest_ran
        if auto is None or not auto.ran or auto.budget_mib is None or not largest:
            return None
        return auto.budget_mib / largest

    def text(self) -> str:
        auto, largest = self.auto, self.largest_ran
        lines = [f"### The largest --cache-mb that runs in {self.limit_mib} MiB", ""]
        lines += [
            "| --cache-mb | ran | budget at start MiB | budget decoding MiB | group peak MiB | error |",
            "| --- | --- | ---: | ---: | ---: | --- |",
        ]
        for t in self.tries:
            name = "auto" if t.cache_mib is None else str(t.cache_mib)
            peak = "" if t.group_peak_mib is None else f"{t.group_peak_mib:,.0f}"
            start = "" if t.start_mib is None else f"{t.start_mib:,}"
            budget = "" if t.budget_mib is None else f"{t.budget_mib:,}"
            ran = "yes" if t.ran else "no"
            lines.append(f"| {name} | {ran} | {start} | {budget} | {peak} | {t.error or ''} |")
        lines.append("")
        auto_text = (
            "did not run"
            if auto is None or not auto.ran
            else f"{auto.budget_mib:,} MiB decoding (from {auto.start_mib:,} at start)"
        )
        ratio = self.ratio()
        lines.append(
            f"auto: {auto_text}; the largest that ran: "
            + ("none" if largest is None else f"{largest:,} MiB")
            + (f"; the smallest that failed: {self.smallest_failed:,} MiB" if self.smallest_failed else "")
            + ("" if ratio is None else f"; auto / largest = {ratio:.2f}")
        )
        return "\n".join(lines)


def find(try_budget: Callable[[int | None], Try], limit_mib: int, max_tries: int = 10) -> Search:
    """Auto first, then its decoding budget given, then bisect (``try_budget`` runs one
    budget, None for auto)."""
    auto = try_budget(None)
    search = Search(limit_mib, (auto,))
    if auto.ran and auto.budget_mib:
        search = Search(limit_mib, (auto, try_budget(auto.budget_mib)))
    while len(search.tries) < max_tries and (budget := search.next_budget()) is not None:
        search = Search(limit_mib, (*search.tries, try_budget(budget)))
    return search


def run_find(args: argparse.Namespace, model: Path, spec_of: Callable[[int | None], dict[str, Any]]) -> int:
    """The search as a command: each try a child in the memory group, the table printed and
    written to ``--out``/largest-cache.md and .json."""
    from bmoe.bench.confinement import confinement_factory
    from bmoe.bench.io_group import DiskThrottle
    from bmoe.bench.runner import run_configuration

    if not args.mem_limit_mb:
        print("bench: --find-cache-mb needs --mem-limit-mb (the limit to search in)", file=sys.stderr)
        return 2
    make_group = confinement_factory(model, args.mem_limit_mb, DiskThrottle(args.disk_mib_s, args.disk_iops))
    args.out.mkdir(parents=True, exist_ok=True)

    def try_budget(cache_mib: int | None) -> Try:
        name = "auto" if cache_mib is None else str(cache_mib)
        print(f"bench: --cache-mb {name} in {args.mem_limit_mb} MiB ...", file=sys.stderr, flush=True)
        result = run_configuration(
            spec_of(cache_mib),
            model=model,
            make_group=make_group,
            timeout_s=args.timeout,
            on_progress=lambda _n: None,
            log_path=args.out / "logs" / f"find-cache-{name}.log",
        )
        found = Try.of(cache_mib, result)
        print(f"bench: --cache-mb {name}: {'ran' if found.ran else found.error}", file=sys.stderr, flush=True)
        return found

    search = find(try_budget, args.mem_limit_mb)
    text = search.text()
    (args.out / "largest-cache.md").write_text(text + "\n")
    payload = {"limit_mib": search.limit_mib, "tries": [attrs.asdict(t) for t in search.tries]}
    (args.out / "largest-cache.json").write_text(json.dumps(payload | {"ratio": search.ratio()}, indent=1))
    print(text)
    return 0 if search.largest_ran is not None else 1
