#!/usr/bin/env python
"""Benchmark expert streaming against the resident model (a bench script, not a test).

    python scripts/bench_stream.py MODEL.gguf --budgets 512,1024,2048 [--write-md docs/benchmarks.md]

What one run does:

1. measures the disk's sequential read bandwidth on the model file itself: the file is
   dropped from the page cache (``posix_fadvise(DONTNEED)``), then read once with
   ``O_DIRECT`` in 4 MiB blocks;
2. runs each configuration in a fresh subprocess (so peak RSS is per configuration):
   resident (no streaming), streaming with the cache off (``cache_mb=0``), and one
   streaming run per ``--budgets`` entry. Before each, the model file is dropped from the
   page cache. With ``--cgroup-mib N`` the subprocess runs inside a cgroup v1 memory limit
   of N MiB (the parent creates the group, writes the child's pid to ``cgroup.procs``, then
   lets the child start loading);
3. decodes by TEACHER FORCING: a fixed English text (built in) is fed one token per
   ``llama_decode`` through the session's context; the first ``--warmup`` tokens are not
   measured. Random models repeat one token under greedy decoding, which would make any
   expert cache look perfect: forcing a real text keeps the routing moving;
4. prints a Markdown table (and, with ``--write-md``, appends it to a file with the exact
   command, the machine and the measured bandwidth).

Figures per configuration: decode tok/s (measured steps only), MiB read per token, hit rate
and I/O seconds from the streamer's counters, effective read throughput = MiB read / I/O
seconds (also as a % of the measured bandwidth), the peak RSS during decode (``VmHWM``
after it was reset once the model was loaded, with ``/proc/self/clear_refs``), the largest
RSS sampled every 10 ms during the measured decode, and, as a yardstick for streaming,
dense bytes + KV + budget.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
BLOCK = 4 * MIB
RESULT_TAG = "BENCH_RESULT "

# A fixed text, fed token by token (teacher forcing). Plain English, written for this bench.
TEXT = """\
The harbour town woke slowly on winter mornings. Before the sun cleared the hills, the
bakers had already lit their ovens, and the smell of bread drifted down the narrow streets
toward the water. Fishermen checked their nets by lamplight, counting the torn places and
arguing about the weather, which they could never predict and never stopped trying to.

Most visitors came in summer, when the ferries ran every hour and the cafes put their
tables out on the quay. In winter the town belonged to the people who lived there: the
teacher who walked her dog along the sea wall at seven, the old man who repaired clocks in
a shop no wider than a doorway, the twins who ran the hardware store and still wrote every
sale in a paper ledger because, they said, paper never forgets and never needs a charger.

The lighthouse at the end of the northern pier had been automated for thirty years, but
the keeper's cottage was still lived in. A retired engineer rented it from the council and
spent his days measuring things: the height of the tide, the speed of the wind, the number
of ships that passed the headland. He kept his numbers in notebooks and, once a month,
typed them into a computer at the library so that a university two hundred miles away
could study how the coast was changing. Nobody in the town had ever asked him what the
numbers showed. When a child finally did, he thought about it for a long time and said
that the sea was patient, that it was winning, and that it would take a very long while.

In the spring the council held a meeting about the sea wall. Engineers had drawn three
plans. The first raised the wall by a metre and cost a great deal of money. The second
moved the road back from the water and cost even more, because houses would have to be
bought. The third did almost nothing and cost almost nothing, and the engineers had
written it down mostly so that people could see what doing nothing would mean. The meeting
went on until midnight. People spoke about their parents and grandparents, about storms
they remembered and storms they had only heard about, about taxes and tourists and the
price of fish. In the end they voted for the first plan, and then, because it was late and
everyone was tired, they went home without deciding how to pay for it.

Work began in the autumn. Lorries brought stone from a quarry in the hills, and a crane
stood on the quay for four months like a patient heron. The children watched from the
school windows. The engineer in the lighthouse cottage added a new column to his
notebooks, for the height of the wall, and drew a careful line across the page each week.
When the first winter storm came, the waves climbed the new stones and fell back, and the
street behind the wall stayed dry. The bakers lit their ovens as usual the next morning,
and the smell of bread drifted down toward the water, which was, for now, where it
belonged.
"""


LEGEND = (
    "tok/s: measured tokens / wall time of the measured decode; ms/tok: per `llama_decode`. "
    "MiB read/tok, hit %, I/O s/tok: the streamer's counters over the measured tokens (a hit is "
    "one (layer, expert) found resident). Eff. read = MiB read / I/O seconds (wall time the reads "
    "took, lanes in parallel), also as a % of the two disk bandwidths above. Peak RSS decode: `VmHWM`, "
    "reset after the model was loaded, read at the end (warm-up + measure); max sampled RSS: every "
    "10 ms during the measure. dense+KV+budget: the dense bytes copied to anonymous memory + an f16 "
    "KV cache of n_ctx cells + the cache budget (what streaming should hold, plus libraries and "
    "compute buffers). Other CPU load: CPUs that other processes kept busy during the measure "
    "(this machine is shared; a figure near or above 1 means the tok/s of that row is disturbed; "
    "read from /proc/stat in 10 ms ticks, so not shown for a measure under 2 s)."
)


# -- machine facts ---------------------------------------------------------------------------


def meminfo_kib(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def filesystem_of(path: Path) -> str:
    """The mount (device, fstype) holding ``path``."""
    best = ("?", "?", "")
    target = str(path.resolve())
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[2]):
                best = (dev, fstype, mnt)
    except OSError:
        pass
    return f"{best[0]} ({best[1]}, mounted on {best[2]})"


def machine_facts(model: Path) -> dict[str, Any]:
    try:
        import llama_cpp

        llama_version = llama_cpp.__version__
    except Exception:  # the facts are informative only
        llama_version = "?"
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "mem_total_gib": meminfo_kib("MemTotal") / MIB,
        "cpu": cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_version,
        "filesystem": filesystem_of(model),
    }


# -- page cache and bandwidth ----------------------------------------------------------------


def drop_from_page_cache(path: Path) -> None:
    """Write back, then drop the file's pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open_for_reads(path: Path) -> tuple[int, bool]:
    """An ``O_DIRECT`` descriptor, or a buffered one where the filesystem refuses the flag."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return os.open(path, os.O_RDONLY), False
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        os.preadv(fd, [probe], 0)  # some filesystems accept the flag and refuse the reads
    except OSError:
        os.close(fd)
        return os.open(path, os.O_RDONLY), False
    finally:
        probe.close()
    return fd, True


def _read_blocks(path: Path, limit: int, lane: int, n_lanes: int, done: list[int]) -> None:
    """Read blocks ``lane, lane + n_lanes, ...`` of 4 MiB below ``limit``; add the bytes to ``done[lane]``."""
    fd, _ = _open_for_reads(path)
    buf = mmap.mmap(-1, BLOCK)  # page aligned, as O_DIRECT needs
    try:
        offset = lane * BLOCK
        while offset < limit:
            n = os.preadv(fd, [buf], offset)
            if n <= 0:
                break
            done[lane] += min(n, limit - offset)
            offset += n_lanes * BLOCK
    finally:
        os.close(fd)
        buf.close()


def measure_bandwidth(path: Path, max_bytes: int | None = None, n_lanes: int = 1) -> dict[str, Any]:
    """Read the file with ``O_DIRECT`` in 4 MiB blocks, after dropping it from the page cache.

    ``n_lanes`` 1 is a plain sequential read (one request in flight); more lanes read
    interleaved blocks on as many threads (requests in flight), as the streamer's lanes do.
    """
    drop_from_page_cache(path)
    size = path.stat().st_size
    limit = size if max_bytes is None else min(size, max_bytes)
    fd, odirect = _open_for_reads(path)
    os.close(fd)
    done = [0] * n_lanes
    threads = [
        threading.Thread(target=_read_blocks, args=(path, limit, lane, n_lanes, done))
        for lane in range(n_lanes)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if not odirect:
        drop_from_page_cache(path)
    total = sum(done)
    return {
        "bytes": total,
        "seconds": seconds,
        "mib_s": total / MIB / seconds if seconds > 0 else 0.0,
        "odirect": odirect,
        "lanes": n_lanes,
    }


# -- cgroup v1 -------------------------------------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def own_memory_cgroup() -> Path:
    """This process's cgroup v1 memory group (nested groups stay under its accounting)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / rel.lstrip("/")
    return CGROUP_ROOT


class MemoryCgroup:
    """A cgroup v1 memory group with a hard limit; removed by ``close``."""

    def __init__(self, parent: Path, name: str, limit_bytes: int) -> None:
        if not (parent / "memory.limit_in_bytes").exists():
            raise SystemExit(f"no cgroup v1 memory controller at {parent}")
        self.path = parent / name
        self.path.mkdir(exist_ok=True)
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        self.limit_bytes = limit_bytes

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def read(self, key: str) -> str:
        try:
            return (self.path / key).read_text()
        except OSError:
            return ""

    def figures(self) -> dict[str, Any]:
        oom_kills = 0
        for line in self.read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                oom_kills = int(line.split()[1])
        max_usage = self.read("memory.max_usage_in_bytes").strip()
        failcnt = self.read("memory.failcnt").strip()
        return {
            "max_usage_bytes": int(max_usage) if max_usage else None,
            "failcnt": int(failcnt) if failcnt else None,
            "oom_kills": oom_kills,
        }

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        print(f"bench: could not remove cgroup {self.path}", file=sys.stderr)


# -- the child: one configuration ------------------------------------------------------------


def proc_status() -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(line.split()[1]) * 1024
    return out


def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (``/proc/stat``, all but idle and iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    guest = sum(values[8:10]) if len(values) > 9 else 0  # already counted in user/nice
    return (sum(values) - idle - guest) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class RssSampler:
    """Samples this process's RSS every ``interval`` seconds (decode releases the GIL)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.max_bytes = 0
        self.samples = 0
        self.active = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.active:
                self.max_bytes = max(self.max_bytes, self.rss())
                self.samples += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Open a session for one configuration, teacher-force the text, return the figures."""
    from bmoe.adapters.llama import ContextParams
    from bmoe.domain.streaming import StreamConfig
    from bmoe.runtime.session import Session, SessionConfig

    stream = StreamConfig(
        enabled=spec["stream"],
        cache_mb=spec.get("cache_mb"),
        io_threads=spec["io_threads"],
        policy=spec.get("policy", "fast"),
    )
    config = SessionConfig(
        model_path=Path(spec["model"]),
        context=ContextParams(n_ctx=spec["n_ctx"], n_threads=spec["threads"]),
        stream=stream,
    )
    t0 = time.perf_counter()
    session = Session.open(config)
    load_s = time.perf_counter() - t0
    out: dict[str, Any] = {"name": spec["name"], "load_s": load_s, "notes": list(session.notes)}
    try:
        model = session.model
        arch = model.arch

        def meta_int(key: str) -> int:
            value = model.meta(f"{arch}.{key}")
            return int(value) if value else 0

        out["model"] = {
            "arch": arch,
            "n_layer": model.n_layer,
            "n_embd": meta_int("embedding_length"),
            "n_ff_exp": meta_int("expert_feed_forward_length"),
            "n_expert": model.n_expert,
            "n_expert_used": model.n_expert_used,
            "n_head": meta_int("attention.head_count"),
            "n_head_kv": meta_int("attention.head_count_kv"),
            "head_dim": meta_int("attention.key_length"),
            "quant": model.meta("bmoe.synthetic.quant") or model.meta("general.file_type") or "?",
            "file_bytes": Path(spec["model"]).stat().st_size,
        }
        m = out["model"]
        # f16 K and V for every layer and cell of the context
        out["kv_bytes"] = m["n_layer"] * session.n_ctx * 2 * m["n_head_kv"] * m["head_dim"] * 2
        out["n_ctx"] = session.n_ctx
        streaming = session.streaming
        out["streaming"] = streaming is not None
        if streaming is not None:
            info = streaming.info
            out["stream_info"] = {
                "budget_bytes": info.budget.bytes,
                "budget_warning": info.budget.warning,
                "odirect": info.odirect,
                "lanes": info.lanes,
                "token_cycle_bytes": info.token_cycle_bytes,
                "expert_bytes": info.expert_bytes,
                "dense_copied_bytes": info.dense_copied_bytes,
            }
        out["after_load"] = proc_status()
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: peaks from here on are decode's

        tokens = model.tokenize(TEXT, add_special=False, parse_special=False)
        warmup, wanted = spec["warmup"], spec["tokens"]
        limit = min(len(tokens), session.n_ctx)
        if warmup + wanted > limit:
            wanted = max(1, limit - warmup)
            out["notes"].append(f"text/context hold {limit} tokens: measured {wanted}")
        ctx = session.ctx
        sampler = RssSampler()
        sampler.start()
        sampler.active = True
        deadline = time.perf_counter() + spec["max_seconds"]
        pos = 0
        for pos in range(warmup):
            ctx.decode([tokens[pos]], pos)
            if time.perf_counter() > deadline and pos + 1 < warmup:
                out["notes"].append(f"warm-up cut at {pos + 1} of {warmup} tokens by --max-seconds")
                break
        start = pos + 1 if warmup else 0
        sampler.max_bytes = 0
        before = streaming.counters() if streaming else None
        steps: list[float] = []
        busy0, own0 = cpu_busy_s(), own_cpu_s()
        t_start = time.perf_counter()
        deadline = t_start + spec["max_seconds"]
        for pos in range(start, start + wanted):
            t = time.perf_counter()
            ctx.decode([tokens[pos]], pos)
            steps.append(time.perf_counter() - t)
            if time.perf_counter() > deadline and len(steps) < wanted:
                out["notes"].append(f"measure cut at {len(steps)} of {wanted} tokens by --max-seconds")
                break
        wall = time.perf_counter() - t_start
        busy, own = cpu_busy_s() - busy0, own_cpu_s() - own0
        # CPUs other processes kept busy while we decoded: a shared machine's noise, in cores
        out["other_cpu_cores"] = max(0.0, busy - own) / wall if wall > 0 else 0.0
        out["own_cpu_cores"] = own / wall if wall > 0 else 0.0
        out["loadavg_end"] = Path("/proc/loadavg").read_text().split()[0]
        sampler.active = False
        sampler.stop()
        logits = session.last_logits()
        out["finite_logits"] = all(math.isfinite(float(x)) for x in logits)
        out["warmup_tokens"] = start
        out["measured_tokens"] = len(steps)
        out["decode_wall_s"] = wall
        out["tok_s"] = len(steps) / wall if wall > 0 else 0.0
        out["step_ms_median"] = 1000 * statistics.median(steps) if steps else 0.0
        out["step_ms_p90"] = 1000 * statistics.quantiles(steps, n=10)[-1] if len(steps) >= 10 else 0.0
        out["sampled_rss_max"] = sampler.max_bytes
        out["rss_samples"] = sampler.samples
        if streaming is not None and before is not None:
            d = streaming.counters() - before
            out["counters"] = {
                "hits": d.hits,
                "misses": d.misses,
                "evictions": d.evictions,
                "rereads": d.rereads,
                "bytes_read": d.bytes_read,
                "io_s": d.io_s,
                "mgmt_s": d.mgmt_s,
                "resident_bytes": d.resident_bytes,
            }
        out["end"] = proc_status()  # VmHWM: the peak since the reset (warm-up + measured decode)
    finally:
        session.close()
    return out


def child_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    if spec.get("wait_go"):
        sys.stdin.readline()  # the parent has put us in the cgroup
    result = run_child(spec)
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


# -- the parent ------------------------------------------------------------------------------


def run_config(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    model = Path(spec["model"])
    drop_from_page_cache(model)
    group = None
    if args.cgroup_mib:
        parent = Path(args.cgroup_parent) if args.cgroup_parent else own_memory_cgroup()
        group = MemoryCgroup(parent, f"bmoe-bench-{os.getpid()}", args.cgroup_mib * MIB)
        spec = {**spec, "wait_go": True}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if group is not None:
            group.add(proc.pid)
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        try:
            stdout, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
            return {"name": spec["name"], "error": f"timed out after {args.timeout} s"}
    finally:
        cg = group.figures() if group is not None else None
        if group is not None:
            group.close()
    result: dict[str, Any] = {"name": spec["name"]}
    for line in stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
    if proc.returncode != 0:
        why = f"exit status {proc.returncode}"
        if cg and cg["oom_kills"]:
            why += " (OOM-killed in the cgroup)"
        result["error"] = why
    result["child_wall_s"] = time.perf_counter() - t0
    if cg is not None:
        result["cgroup"] = cg
    return result


def pick_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median tok/s among a configuration's repeats (a failure if none ran)."""
    ok = sorted((r for r in runs if "tok_s" in r), key=lambda r: r["tok_s"])
    if not ok:
        return runs[-1]
    chosen = dict(ok[(len(ok) - 1) // 2])
    if len(runs) > 1:
        chosen["repeats"] = [round(r["tok_s"], 2) if "tok_s" in r else None for r in runs]
    return chosen


def _mib(n: float | None) -> str:
    return "" if n is None else f"{n / MIB:,.0f}"


def table(results: list[dict[str, Any]], bw_mib_s: float, bw_par: dict[str, Any]) -> str:
    head = [
        "configuration",
        "tok/s",
        "ms/tok median / p90",
        "MiB read/tok",
        "hit %",
        "I/O s/tok",
        "eff. read MiB/s",
        "% of seq. bw",
        f"% of {bw_par['lanes']}-lane bw",
        "peak RSS decode MiB",
        "max sampled RSS MiB",
        "dense+KV+budget MiB",
        "other CPU load",
    ]
    with_cg = any("cgroup" in r for r in results)
    if with_cg:
        head.append("cgroup peak MiB")
    rows = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for r in results:
        if "error" in r and "tok_s" not in r:
            cells = [r["name"], f"failed: {r['error']}"] + [""] * (len(head) - 2)
            rows.append("| " + " | ".join(cells) + " |")
            continue
        n = max(1, r["measured_tokens"])
        c = r.get("counters")
        info = r.get("stream_info")
        if c is not None:
            per_tok = c["bytes_read"] / MIB / n
            read_tok = f"{per_tok:.1f}" if per_tok >= 10 or per_tok == 0 else f"{per_tok:.2f}"
            total = c["hits"] + c["misses"]
            hit = f"{100 * c['hits'] / total:.1f}" if total else ""
            io_tok = f"{c['io_s'] / n:.3f}"
            eff = c["bytes_read"] / MIB / c["io_s"] if c["io_s"] > 0 else 0.0
            eff_s = f"{eff:,.0f}" if c["bytes_read"] else ""
            pct = f"{100 * eff / bw_mib_s:.0f}%" if c["bytes_read"] and bw_mib_s > 0 else ""
            par = bw_par["mib_s"]
            pct_par = f"{100 * eff / par:.0f}%" if c["bytes_read"] and par > 0 else ""
        else:
            read_tok = hit = io_tok = eff_s = pct = pct_par = ""
        if info is not None:
            yard = _mib(info["dense_copied_bytes"] + r["kv_bytes"] + info["budget_bytes"])
        else:
            yard = f"file {_mib(r['model']['file_bytes'])} + KV {_mib(r['kv_bytes'])}"
        cells = [
            r["name"],
            f"{r['tok_s']:.2f}",
            f"{r['step_ms_median']:.1f} / {r['step_ms_p90']:.1f}",
            read_tok,
            hit,
            io_tok,
            eff_s,
            pct,
            pct_par,
            _mib(r["end"]["VmHWM"]),
            _mib(r["sampled_rss_max"]),
            yard,
            f"{r.get('other_cpu_cores', 0.0):.2f}" if r["decode_wall_s"] >= 2 else "(too short)",
        ]
        if with_cg:
            cells.append(_mib(r.get("cgroup", {}).get("max_usage_bytes")))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def shape_line(r: dict[str, Any]) -> str:
    m = r["model"]
    return (
        f"{m['arch']}, {m['n_layer']} layers, {m['n_embd']} hidden, {m['n_ff_exp']} expert width, "
        f"{m['n_expert']} experts, top-{m['n_expert_used']}, {m['n_head']}/{m['n_head_kv']} heads x "
        f"{m['head_dim']}, {m['quant']}, "
        f"file {m['file_bytes'] / 1e9:.2f} GB ({m['file_bytes'] / MIB:,.0f} MiB)"
    )


def summary(results: list[dict[str, Any]]) -> list[str]:
    """Ratios worth quoting: best streaming vs resident, memory per configuration."""
    ok = [r for r in results if "tok_s" in r]
    lines = []
    resident = next((r for r in ok if not r.get("streaming")), None)
    streamed = [r for r in ok if r.get("streaming")]
    if resident and streamed:
        for r in streamed:
            lines.append(
                f"- {r['name']}: {r['tok_s']:.2f} tok/s = {r['tok_s'] / resident['tok_s']:.2f}x resident "
                f"({resident['tok_s']:.2f}); median step {r['step_ms_median']:.1f} ms vs "
                f"{resident['step_ms_median']:.1f} ms"
            )
    for r in streamed:
        info = r["stream_info"]
        if info["budget_bytes"] >= info["expert_bytes"]:
            lines.append(f"- {r['name']}: the budget holds every expert ({_mib(info['expert_bytes'])} MiB)")
        if info.get("budget_warning"):
            lines.append(f"- {r['name']}: {info['budget_warning']}")
    if streamed:
        info = streamed[0]["stream_info"]
        lines.append(
            f"- experts {_mib(info['expert_bytes'])} MiB, dense part copied to anonymous memory "
            f"{_mib(info['dense_copied_bytes'])} MiB, token cycle {_mib(info['token_cycle_bytes'])} MiB, "
            f"KV {_mib(streamed[0]['kv_bytes'])} MiB (n_ctx {streamed[0]['n_ctx']}), "
            f"reads {'O_DIRECT' if info['odirect'] else 'buffered'} on {info['lanes']} lanes"
        )
    for r in ok:
        if "repeats" in r:
            lines.append(
                f"- {r['name']}: tok/s of the {len(r['repeats'])} rounds {r['repeats']} (median shown)"
            )
        for note in r.get("notes", []):
            lines.append(f"- {r['name']}: {note}")
        if not r.get("finite_logits", True):
            lines.append(f"- {r['name']}: NON-FINITE LOGITS")
    for r in results:
        if "error" in r:
            lines.append(f"- {r['name']}: failed ({r['error']})")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, nargs="?")
    p.add_argument("--budgets", default="512,1024,2048", help="cache budgets in MiB, comma separated")
    p.add_argument("--warmup", type=int, default=32, help="teacher-forced tokens not measured")
    p.add_argument("--tokens", type=int, default=128, help="teacher-forced tokens measured")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp compute threads")
    p.add_argument("--io-threads", type=int, default=4, help="read lanes")
    p.add_argument("--ctx", type=int, default=0, help="context length (default: warmup + tokens, >= 256)")
    p.add_argument("--max-seconds", type=float, default=300.0, help="cap on warm-up and on measure, each")
    p.add_argument("--timeout", type=float, default=1800.0, help="kill a configuration after this long")
    p.add_argument("--repeat", type=int, default=1, help="rounds over all configurations (median shown)")
    p.add_argument(
        "--reference", action="store_true", help="also run each budget with --stream-policy reference"
    )
    p.add_argument("--skip", default="", help="configurations to skip: resident, nocache (comma separated)")
    p.add_argument("--cgroup-mib", type=int, default=0, help="run each configuration in a cgroup v1 limit")
    p.add_argument(
        "--cgroup-parent",
        default=None,
        help="cgroup v1 memory folder to create the group in (default: this process's own group)",
    )
    p.add_argument("--bw-max-mib", type=int, default=0, help="read at most this much for the bandwidth")
    p.add_argument("--write-md", type=Path, default=None, help="append the results to this Markdown file")
    p.add_argument("--title", default="", help="heading of the appended section")
    p.add_argument("--json", type=Path, default=None, help="also write every figure as JSON")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        return child_main(args.child)
    if args.model is None:
        p.error("the model path is required")
    model = args.model.resolve()
    if not model.is_file():
        p.error(f"no such file: {model}")
    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    n_ctx = args.ctx or max(256, args.warmup + args.tokens)

    facts = machine_facts(model)
    print(
        f"bench: {facts['nproc']} CPUs, MemTotal {facts['mem_total_gib']:.1f} GiB, {facts['cpu']}",
        file=sys.stderr,
    )
    cap = args.bw_max_mib * MIB or None
    bw = measure_bandwidth(model, cap)
    bw_par = measure_bandwidth(model, cap, n_lanes=args.io_threads) if args.io_threads > 1 else bw
    disk = (
        f"{bw['mib_s']:,.0f} MiB/s sequential, one 4 MiB read in flight; "
        f"{bw_par['mib_s']:,.0f} MiB/s with {bw_par['lanes']} reads in flight "
        f"({'O_DIRECT' if bw['odirect'] else 'buffered (the filesystem refused O_DIRECT)'}, "
        f"{bw['bytes'] / MIB:,.0f} MiB of the model file read after dropping it from the page cache)"
    )
    print(f"bench: disk: {disk}", file=sys.stderr)

    base = {
        "model": str(model),
        "n_ctx": n_ctx,
        "threads": args.threads,
        "io_threads": args.io_threads,
        "warmup": args.warmup,
        "tokens": args.tokens,
        "max_seconds": args.max_seconds,
    }
    specs = []
    if "resident" not in skip:
        specs.append({**base, "name": "resident (no streaming)", "stream": False})
    if "nocache" not in skip:
        specs.append({**base, "name": "stream, cache off", "stream": True, "cache_mb": 0})
    specs += [{**base, "name": f"stream, cache {b} MiB", "stream": True, "cache_mb": b} for b in budgets]
    if args.reference:
        specs += [
            {
                **base,
                "name": f"stream, cache {b} MiB, reference policy",
                "stream": True,
                "cache_mb": b,
                "policy": "reference",
            }
            for b in budgets
        ]

    runs: dict[str, list[dict[str, Any]]] = {spec["name"]: [] for spec in specs}
    for round_no in range(args.repeat):  # rounds interleave the configurations
        for spec in specs:
            print(
                f"bench: {spec['name']} (round {round_no + 1}/{args.repeat}) ...", file=sys.stderr, flush=True
            )
            r = run_config(spec, args)
            runs[spec["name"]].append(r)
            if "tok_s" in r:
                print(
                    f"bench:   {r['tok_s']:.2f} tok/s over {r['measured_tokens']} tokens, "
                    f"peak RSS decode {_mib(r['end']['VmHWM'])} MiB, "
                    f"other processes kept {r['other_cpu_cores']:.2f} CPUs busy",
                    file=sys.stderr,
                )
            else:
                print(f"bench:   failed: {r.get('error')}", file=sys.stderr)
    results = [pick_run(rs) for rs in runs.values()]

    first = next((r for r in results if "model" in r), None)
    md = table(results, bw["mib_s"], bw_par)
    notes = summary(results)
    print(md)
    print("\n".join(notes))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "facts": facts,
                    "bandwidth": bw,
                    "bandwidth_lanes": bw_par,
                    "results": results,
                    "runs": runs,
                },
                indent=1,
            )
        )
    if args.write_md:
        cmd = shlex.join(["python", os.path.relpath(__file__), *(argv if argv is not None else sys.argv[1:])])
        limit = f", inside a cgroup v1 memory limit of {args.cgroup_mib} MiB" if args.cgroup_mib else ""
        real_ctx = first["n_ctx"] if first else n_ctx
        ctx_text = str(n_ctx) if real_ctx == n_ctx else f"{n_ctx} asked, {real_ctx} in llama.cpp"
        previous = args.write_md.read_text() if args.write_md.exists() else ""
        legend = "Columns: see the legend of the first table on this page." if LEGEND in previous else LEGEND
        section = [
            "",
            f"## {args.title or 'Run'} ({time.strftime('%Y-%m-%d')})",
            "",
            f"Model: {shape_line(first) if first else model.name}.",
            "",
            "```sh",
            cmd,
            "```",
            "",
            f"Machine: {facts['nproc']} CPUs ({facts['cpu']}), MemTotal {facts['mem_total_gib']:.1f} GiB, "
            f"kernel {facts['kernel']}, llama-cpp-python {facts['llama_cpp_python']}, model on "
            f"{facts['filesystem']}. Disk, measured in the same run: {disk}.",
            "",
            f"Decode: teacher forcing over the built-in English text, {args.warmup} warm-up tokens then "
            f"{args.tokens} measured, one token per `llama_decode`, {args.threads} compute threads, "
            f"{args.io_threads} read lanes, n_ctx {ctx_text}, each configuration in a fresh process{limit}.",
            "",
            md,
            "",
            legend,
            "",
            *notes,
            "",
        ]
        with args.write_md.open("a") as f:
            f.write("\n".join(section))
        print(f"bench: appended to {args.write_md}", file=sys.stderr)
    return 0 if all("tok_s" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
