"""The cache governor under memory pressure, cycle after cycle (not a test): a streamed session
generates throughout while another process in the same memory cgroup takes the memory free
to it plus ``--over-mib``, holds it, frees it, ``--cycles`` times.

    python tools/governor_cycles.py [--cycles 20] [--limit-mib 1536] [--cache-mib 400]
                                    [--out DIR] [--chart PNG] [--model PATH]

The two processes are those of the governor's pressure gate (``python -m bmoe.bench.pressure
session|hog``, tests/gates/test_governor_pressure.py) on its model (``pressure_shape()``: 8
layers x 64 experts, 432 MiB of experts, generated into ``--out`` unless ``--model``), in a
memory cgroup of ``--limit-mib`` (``bmoe.bench.cgroup``; needs root or a delegated group).
Afterwards the same number of turns runs unpressured and ungoverned, outside the group, and
every reply is compared with its pressured twin.

Writes to ``--out`` (default ``governor-cycles/``):

- ``series.csv``: per governor reading (every 0.1 s): time, budget and resident MiB, the
  group's usage and limit (sampled here every 0.1 s, the nearest before), what the governor
  read (room, usable, PSI ``some avg10``: on cgroup v1 the machine's), the other process's
  MiB held, the cycle;
- ``summary.json``: the command's figures, the governor's changes (their time: when the budget
  was set, i.e. once the decode in flight ended), and per cycle: the budget's least and most,
  the time from the other process's first block to the first shrink (and to the least
  budget), from the reading that decided that shrink to the budget set
  (``first_shrink_wait_s``: the wait for the decode in flight), from its free to the budget
  back at the ceiling and to the cache filled again (85%), the group's peak usage, and when
  the other process was OOM-killed (``killed_s``), if it was;
- ``raw.json``: what the processes said, for ``--from-raw`` (figures and chart again);
- the chart (``--chart``, default ``DIR/governor-cycles.png``; needs matplotlib,
  ``pip install 'bmoe[bench]'``): budget, resident, the other process's MiB and the group's
  usage against its limit over time, and under it the governor's readings.

Exit status 0 when nobody was OOM-killed and every reply equals its unpressured twin.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any

from bmoe.bench.cgroup import CgroupError, MemoryGroup, machine_sites
from bmoe.bench.pressure import FILLED, pressure_shape
from bmoe.tinymodel.synthetic import write_synthetic

MIB = 1024 * 1024
PRESSURE = [sys.executable, "-m", "bmoe.bench.pressure"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--limit-mib", type=int, default=1536, help="the memory cgroup's limit")
    p.add_argument("--cache-mib", type=int, default=400, help="the cache budget at start: the ceiling")
    p.add_argument("--over-mib", type=int, default=200, help="the other process takes what is free + this")
    p.add_argument("--step-mib", type=int, default=64, help="... in blocks of this, one each 0.5 s")
    p.add_argument("--hold-s", type=float, default=2.0)
    p.add_argument("--rest-s", type=float, default=4.0)
    p.add_argument("--wait-s", type=float, default=60.0, help="the longest wait for the cache to refill")
    p.add_argument("--model", type=Path, default=None, help="default: the gate's model, made in --out")
    p.add_argument("--out", type=Path, default=Path("governor-cycles"))
    p.add_argument("--chart", type=Path, default=None)
    p.add_argument("--from-raw", type=Path, default=None, help="no run: the figures again from a raw.json")
    return p.parse_args(argv)


class GroupSampler(threading.Thread):
    """Every ``interval_s``: ``(time.monotonic(), the group's usage, the session's RSS,
    its anonymous RSS)`` in bytes (-1 where a file could not be read)."""

    def __init__(self, group: MemoryGroup, session_pid: int, interval_s: float = 0.1) -> None:
        super().__init__(name="group-sampler", daemon=True)
        self.group = group
        self.status = Path(f"/proc/{session_pid}/status")
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            usage = self.group.usage_bytes()
            fields = {}
            try:
                for line in self.status.read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "RssAnon"):
                        fields[key] = int(value.split()[0]) * 1024
            except OSError:
                pass
            self.samples.append(
                (
                    time.monotonic(),
                    -1 if usage is None else usage,
                    fields.get("VmRSS", -1),
                    fields.get("RssAnon", -1),
                )
            )


def _session(model: Path, signals: Path, cache_mib: int, *, governed: bool, turns: int, max_s: float) -> Any:
    signals.mkdir(parents=True, exist_ok=True)
    cmd = [*PRESSURE, "session", str(model), str(signals), f"--turns={turns}", f"--cache-mib={cache_mib}"]
    cmd += [f"--max-s={max_s}", *(["--governed"] if governed else [])]
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def pressured(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """The governed session and the other process in one group: what each said, the group's
    samples, OOM kills."""
    group = MemoryGroup.create(machine_sites(), f"bmoe-governor-cycles-{os.getpid()}", args.limit_mib * MIB)
    signals = args.out / "signals"
    for name in ("filled", "done"):
        (signals / name).unlink(missing_ok=True)
    hog_log = args.out / "hog.jsonl"
    hog_log.unlink(missing_ok=True)
    bound = args.cycles * (args.wait_s + 60.0) + 60.0
    try:
        session = _session(model, signals, args.cache_mib, governed=True, turns=0, max_s=bound)
        hog = subprocess.Popen(
            [*PRESSURE, "hog", str(signals), f"--cycles={args.cycles}", f"--over-mib={args.over_mib}",
             f"--step-mib={args.step_mib}", f"--hold-s={args.hold_s}", f"--rest-s={args.rest_s}",
             f"--wait-s={args.wait_s}", f"--log={hog_log}"],
            stdin=subprocess.PIPE, text=True,
        )  # fmt: skip
        group.add(session.pid)
        group.add(hog.pid)
        sampler = GroupSampler(group, session.pid)
        sampler.start()

        hog_end: list[float] = []

        def stop_when_the_hog_ends() -> None:  # killed too: the session must not wait for it
            hog.wait()
            hog_end.append(time.monotonic())
            (signals / "done").touch()

        threading.Thread(target=stop_when_the_hog_ends, daemon=True).start()
        t0 = time.monotonic()
        assert hog.stdin is not None
        hog.stdin.write("go\n")
        hog.stdin.close()
        out, err = session.communicate("go\n", timeout=bound + 120)
        hog_rc = hog.wait(timeout=120)
        sampler.stop.set()
        sampler.join()
        oom_kills = group.oom_kills()
        peak = group.peak_bytes()
    finally:
        group.close()
    if session.returncode != 0:
        sys.exit(f"the pressured session exited {session.returncode}: {err[-3000:]}")
    hog_events = [json.loads(line) for line in hog_log.read_text().splitlines() if line.strip()]
    if hog_rc != 0 and hog_end:  # killed: from then on it holds nothing
        cycle = hog_events[-1]["cycle"] if hog_events else 0
        hog_events.append({"t": hog_end[0], "cycle": cycle, "held_mib": 0.0, "event": "killed"})
    lines = _lines(out)
    [end] = [line for line in lines if "changes" in line]
    return {
        "t0": t0,
        "turns": [line for line in lines if "tokens" in line],
        "changes": end["changes"],
        "samples": end["samples"],
        "hog": hog_events,
        "hog_rc": hog_rc,
        "session_rc": session.returncode,
        "group": sampler.samples,
        "oom_kills": oom_kills,
        "peak_bytes": peak,
        "cgroup_version": group.site.version,
        "wall_s": time.monotonic() - t0,
    }


def unpressured(args: argparse.Namespace, model: Path, turns: int) -> list[dict[str, Any]]:
    session = _session(model, args.out / "signals-calm", args.cache_mib, governed=False, turns=turns, max_s=0)
    out, err = session.communicate("go\n", timeout=3600)
    if session.returncode != 0:
        sys.exit(f"the unpressured session exited {session.returncode}: {err[-3000:]}")
    return [line for line in _lines(out) if "tokens" in line]


def _before(times: list[float], values: list[Any], t: float, default: Any) -> Any:
    """The value of the last sample at or before ``t``."""
    i = bisect_right(times, t)
    return values[i - 1] if i else default


def series(run: dict[str, Any], limit_bytes: int) -> list[dict[str, Any]]:
    """One row per governor reading."""
    gt = [sample[0] for sample in run["group"]]
    gv = [sample[1:] for sample in run["group"]]
    ht = [e["t"] for e in run["hog"]]
    hv = [(e["held_mib"], e["cycle"]) for e in run["hog"]]
    rows = []
    for t, room, usable, psi, budget, resident in run["samples"]:
        usage, rss, anon = _before(gt, gv, t, (-1, -1, -1))
        held, cycle = _before(ht, hv, t, (0.0, -1))
        rows.append(
            {
                "t_s": round(t - run["t0"], 3),
                "budget_mib": round(budget / MIB, 2),
                "resident_mib": round(resident / MIB, 2),
                "group_usage_mib": None if usage < 0 else round(usage / MIB, 2),
                "group_limit_mib": round(limit_bytes / MIB, 2),
                "session_rss_mib": None if rss < 0 else round(rss / MIB, 2),
                "session_anon_mib": None if anon < 0 else round(anon / MIB, 2),
                "room_mib": round(room / MIB, 2),
                "usable_mib": round(usable / MIB, 2),
                "psi_some_avg10": psi,
                "hog_held_mib": round(held, 2),
                "cycle": cycle,
            }
        )
    return rows


def cycles(run: dict[str, Any], rows: list[dict[str, Any]], ceil_mib: float, cache_mib: int) -> list[dict]:
    """Per cycle of the other process: how the budget followed it."""
    t0 = run["t0"]
    starts = {e["cycle"]: e["t"] - t0 for e in run["hog"] if e["event"] == "start"}
    frees = {e["cycle"]: e["t"] - t0 for e in run["hog"] if e["event"] == "free"}
    changes = [(t - t0, before / MIB, after / MIB) for t, before, after, _ in run["changes"]]
    out = []
    for k in sorted(starts):
        start, free = starts[k], frees.get(k)
        end = starts.get(k + 1, rows[-1]["t_s"] if rows else start)
        window = [r for r in rows if start <= r["t_s"] < end]
        budgets = [r["budget_mib"] for r in window] + [a for t, _, a in changes if start <= t < end]
        shrinks = [(t, a) for t, b, a in changes if start <= t < end and a < b]
        blocks = [e["t"] - t0 for e in run["hog"] if e["cycle"] == k and e["event"] == "alloc"]
        crossing = [b for b in blocks if shrinks and b <= shrinks[0][0]]
        down = None
        if shrinks:
            down = next(
                (
                    r["t_s"]
                    for r in window
                    if r["t_s"] >= shrinks[0][0] and r["resident_mib"] <= shrinks[0][1]
                ),
                None,
            )
        hog_t = [e["t"] - t0 for e in run["hog"]]
        held_at = (
            None if not shrinks else _before(hog_t, [e["held_mib"] for e in run["hog"]], shrinks[0][0], 0.0)
        )
        killed = next((e["t"] - t0 for e in run["hog"] if e["cycle"] == k and e["event"] == "killed"), None)
        decided = None  # the reading that decided the first shrink: the last before it was applied
        if shrinks:
            decided = max((r["t_s"] for r in rows if r["t_s"] <= shrinks[0][0]), default=None)
        least = min(budgets, default=None)
        at_least = next((t for t, a in shrinks if a == least), None)
        back = refilled = None
        if free is not None:
            back = next((r["t_s"] for r in window if r["t_s"] >= free and r["budget_mib"] >= ceil_mib), None)
            refilled = next(
                (r["t_s"] for r in window if r["t_s"] >= free and r["resident_mib"] >= FILLED * cache_mib),
                None,
            )
        usage = [r["group_usage_mib"] for r in window if r["group_usage_mib"] is not None]
        held = [r["hog_held_mib"] for r in window]
        psi = [r["psi_some_avg10"] for r in window if r["psi_some_avg10"] is not None]
        rss = [r["session_rss_mib"] for r in window if r["session_rss_mib"] is not None]
        out.append(
            {
                "cycle": k,
                "killed_s": None if killed is None else round(killed - start, 2),
                "budget_min_mib": least,
                "budget_max_mib": max(budgets, default=None),
                "shrinks": len(shrinks),
                "first_shrink_s": None if not shrinks else round(shrinks[0][0] - start, 2),
                "shrink_after_block_s": None if not crossing else round(shrinks[0][0] - crossing[-1], 2),
                "held_at_first_shrink_mib": held_at,
                "first_shrink_wait_s": None if decided is None else round(shrinks[0][0] - decided, 2),
                "resident_down_s": None if down is None else round(down - shrinks[0][0], 2),
                "least_budget_s": None if at_least is None else round(at_least - start, 2),
                "hog_held_max_mib": max(
                    (e["held_mib"] for e in run["hog"] if e["cycle"] == k), default=max(held, default=0.0)
                ),
                "room_min_mib": min((r["room_mib"] for r in window), default=None),
                "group_usage_max_mib": max(usage, default=None),
                "psi_max": max(psi, default=None),
                "session_rss_min_mib": min(rss, default=None),
                "session_rss_max_mib": max(rss, default=None),
                "budget_back_s": None if back is None or free is None else round(back - free, 2),
                "refilled_s": None if refilled is None or free is None else round(refilled - free, 2),
            }
        )
    return out


def chart(rows: list[dict[str, Any]], run: dict[str, Any], out: Path, title: str, shrink_mib: float) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no chart: matplotlib is missing (pip install 'bmoe[bench]')", file=sys.stderr)
        return
    t = [r["t_s"] for r in rows]
    fig, (top, low) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=[3, 2])
    limit = rows[0]["group_limit_mib"] if rows else 0
    top.axhline(limit, color="black", linewidth=0.8, linestyle="--", label=f"group limit {limit:,.0f} MiB")
    top.plot(
        t, [r["group_usage_mib"] for r in rows], color="tab:gray", linewidth=0.8, label="group usage (both)"
    )
    top.fill_between(
        t, [r["hog_held_mib"] for r in rows], step="post", color="tab:red", alpha=0.25,
        label="the other process's MiB",
    )  # fmt: skip
    top.plot(
        t, [r["budget_mib"] for r in rows], color="tab:blue", drawstyle="steps-post", label="cache budget"
    )
    top.plot(t, [r["resident_mib"] for r in rows], color="tab:green", linewidth=0.8, label="cache resident")
    top.plot(
        t, [r.get("session_rss_mib") for r in rows], color="tab:olive", linewidth=0.8, label="session RSS"
    )
    top.set_ylabel("MiB")
    top.set_ylim(bottom=0)
    top.grid(True, alpha=0.3)
    top.legend(fontsize=8, loc="upper right", ncol=3)
    low.plot(
        t, [r["room_mib"] for r in rows], color="tab:purple", linewidth=0.8, label="room (governor's reading)"
    )
    low.axhline(
        shrink_mib, color="tab:purple", linewidth=0.8, linestyle=":", label=f"shrink below {shrink_mib:,.0f}"
    )
    low.set_ylabel("MiB free to the session")
    low.set_xlabel("seconds")
    low.set_ylim(bottom=0)
    low.grid(True, alpha=0.3)
    psi = [r["psi_some_avg10"] for r in rows]
    handles, labels = low.get_legend_handles_labels()
    if any(p is not None for p in psi):
        twin = low.twinx()
        twin.plot(t, [float("nan") if p is None else p for p in psi], color="tab:orange", linewidth=0.8)
        twin.set_ylabel("PSI some avg10 (%)", color="tab:orange")
        twin.set_ylim(bottom=0, top=max(10.0, *(p for p in psi if p is not None)))
        handles.append(twin.lines[0])
        labels.append("PSI memory some avg10 (machine's)")
    low.legend(handles, labels, fontsize=8, loc="upper right", ncol=3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or args.out / "model.gguf"
    if not model.exists() and args.from_raw is None:
        write_synthetic(model, pressure_shape(), 0, progress=False)
    if args.from_raw is not None:  # the figures and the chart again, from a run's raw.json
        run = json.loads(args.from_raw.read_text())
        calm = run["calm"]
    else:
        try:
            run = pressured(args, model)
        except CgroupError as exc:
            sys.exit(f"no memory cgroup: {exc}")
        calm_t0 = time.monotonic()
        run["calm"] = calm = unpressured(args, model, len(run["turns"]))
        run["calm_wall_s"] = time.monotonic() - calm_t0
        args.out.joinpath("raw.json").write_text(json.dumps(run) + "\n")
    turns = run["turns"]
    exact = sum(a["tokens"] == b["tokens"] for a, b in zip(turns, calm, strict=True))
    rows = series(run, args.limit_mib * MIB)
    per_cycle = cycles(run, rows, float(args.cache_mib), args.cache_mib)
    with args.out.joinpath("series.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["t_s"])
        w.writeheader()
        w.writerows(rows)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    summary = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": f"{os.cpu_count()} cores, {mem:.1f} GiB, {platform.platform()}",
        "cgroup": f"v{run['cgroup_version']}, limit {args.limit_mib} MiB",
        "cycles": args.cycles,
        "cycles_seen": len(per_cycle),
        "oom_kills": run["oom_kills"],
        "session_rc": run["session_rc"],
        "hog_rc": run["hog_rc"],
        "turns": len(turns),
        "replies_exact": exact,
        "pressured_wall_s": round(run["wall_s"], 1),
        "unpressured_wall_s": round(run["calm_wall_s"], 1),
        "group_peak_mib": None if run["peak_bytes"] is None else round(run["peak_bytes"] / MIB, 1),
        "changes": [[round(t - run["t0"], 3), b / MIB, a / MIB, why] for t, b, a, why in run["changes"]],
        "per_cycle": per_cycle,
    }
    args.out.joinpath("summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    title = (
        f"cache governor, {len(per_cycle)} of {args.cycles} cycles: another process takes the free memory "
        f"+ {args.over_mib} MiB in a {args.limit_mib:,} MiB cgroup; {run['oom_kills']} OOM kills, "
        f"{exact}/{len(turns)} replies exact"
    )
    chart(rows, run, args.chart or args.out / "governor-cycles.png", title, 200.0)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("changes", "per_cycle")}, indent=1))
    for c in per_cycle:
        print(json.dumps(c))
    return 0 if run["oom_kills"] == 0 and exact == len(turns) and run["hog_rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
