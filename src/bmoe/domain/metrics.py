"""Per-token metrics of a one-shot run (``--csv FILE``): the pure formatting and parsing.

The file, ``# bmoe_metrics v2``::

    # bmoe_metrics v2
    # model=/models/x.gguf           <- the run's configuration, one key=value a line
    # ...
    step,wall_ms,io_ms,...            <- the header: read columns by name
    1,12.345,...                      <- one row per generated token
    # summary
    # tokens=8                        <- the run's figures, keys and values as BMOE_DONE's
    # ...

Lines starting with ``#`` are comments to a CSV reader (``pandas.read_csv(comment="#")``).
Streaming figures are -1 on a run that does not stream; ``cache_hit_pct`` is -1 for a token
that made no expert request. No I/O here: the CLI reads ``/proc/self/status`` and writes.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping

import attrs

from bmoe.domain.drafting import DraftReport
from bmoe.domain.generation import Progress, RunResult
from bmoe.domain.streaming import MIB

FORMAT_LINE = "# bmoe_metrics v2"
SUMMARY_LINE = "# summary"
NOT_MEASURED = -1.0  # as BMOE_DONE's

COLUMNS = (
    "step",
    "wall_ms",
    "io_ms",
    "compute_ms",
    "stall_ms",
    "mgmt_ms",
    "read_bytes",
    "cache_hit_pct",
    "rss_mib",
    "rss_anon_mib",
    "rss_file_mib",
    "prefetch_issued",
    "prefetch_hits",
)


class MetricsFormatError(ValueError):
    """A file that is not a ``bmoe_metrics v2`` CSV; the message says where."""


@attrs.frozen
class MemorySample:
    """The process's resident memory in MiB (-1 where unknown): all, anonymous, file-backed."""

    rss_mib: float = NOT_MEASURED
    rss_anon_mib: float = NOT_MEASURED
    rss_file_mib: float = NOT_MEASURED


def parse_proc_status(text: str) -> MemorySample:
    """``VmRSS``, ``RssAnon`` and ``RssFile`` of a ``/proc/<pid>/status`` text (kB lines)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                found[key] = int(parts[0]) / 1024.0
    return MemorySample(
        rss_mib=found.get("VmRSS", NOT_MEASURED),
        rss_anon_mib=found.get("RssAnon", NOT_MEASURED),
        rss_file_mib=found.get("RssFile", NOT_MEASURED),
    )


@attrs.frozen
class TokenRow:
    """One generated token's row. Times in ms; the split is BMOE_PROGRESS's."""

    step: int
    wall_ms: float
    io_ms: float  # the read lanes' busy time (summed over lanes)
    compute_ms: float  # wall time not spent waiting for reads nor managing the cache
    stall_ms: float  # the compute's wait for reads
    mgmt_ms: float
    read_bytes: int
    cache_hit_pct: float
    rss_mib: float
    rss_anon_mib: float
    rss_file_mib: float
    prefetch_issued: int
    prefetch_hits: int


def token_row(p: Progress, memory: MemorySample) -> TokenRow:
    """The row of one token's ``Progress`` (its ``stream`` is that token's counter deltas)."""
    mem = (memory.rss_mib, memory.rss_anon_mib, memory.rss_file_mib)
    s = p.stream
    if s is None:
        nm = NOT_MEASURED
        return TokenRow(p.step, p.wall_ms, nm, nm, nm, nm, -1, nm, *mem, -1, -1)
    stall_ms, mgmt_ms = s.stall_s * 1000.0, s.mgmt_s * 1000.0
    return TokenRow(
        step=p.step,
        wall_ms=p.wall_ms,
        io_ms=s.io_s * 1000.0,
        compute_ms=max(0.0, p.wall_ms - stall_ms - mgmt_ms),
        stall_ms=stall_ms,
        mgmt_ms=mgmt_ms,
        read_bytes=s.bytes_read,
        cache_hit_pct=s.hit_pct,
        rss_mib=memory.rss_mib,
        rss_anon_mib=memory.rss_anon_mib,
        rss_file_mib=memory.rss_file_mib,
        prefetch_issued=s.prefetch_issued,
        prefetch_hits=s.prefetch_hits,
    )


def run_summary(result: RunResult, load_s: float) -> dict[str, float | int | bool]:
    """The figures of ``BMOE_DONE`` for this run (its keys but ``id`` and the content:
    ``text``, ``reasoning``, ``tool_calls``, ``logprobs``)."""
    out: dict[str, float | int | bool] = {
        "cancelled": result.cancelled,
        "tokens": len(result.tokens),
        "tok_s": result.tok_s,
        "prefill_s": result.prefill_s,
        "prefill_tps": result.prefill_tps,
        "load_s": load_s,
        "n_prompt": result.n_prompt,
        "n_past": result.n_past,
        "n_restored": result.n_restored,
    }
    r = result.stream
    streamed = {
        "cache_hit_pct": r.decode.hit_pct if r else NOT_MEASURED,
        "read_mib": r.decode.read_mib if r else NOT_MEASURED,
        "io_s_tok": r.io_s_tok if r else NOT_MEASURED,
        "compute_s_tok": r.compute_s_tok if r else NOT_MEASURED,
        "mgmt_s_tok": r.mgmt_s_tok if r else NOT_MEASURED,
        "stall_s_tok": r.stall_s_tok if r else NOT_MEASURED,
        "cache_resident_mib": r.decode.resident_bytes / MIB if r else NOT_MEASURED,
        "cache_budget_mib": r.decode.budget_bytes / MIB if r else NOT_MEASURED,
        "prefill_read_mib": r.prefill.read_mib if r else NOT_MEASURED,
        "prefill_io_s": r.prefill.io_s if r else NOT_MEASURED,
        "prefill_stall_s": r.prefill.stall_s if r else NOT_MEASURED,
    }
    out.update(streamed)
    return out


# -- writing ---------------------------------------------------------------------------------


def _value(v: object) -> str:
    """A value as written: bools as true/false, floats exactly (``repr`` round-trips)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    text = repr(v) if isinstance(v, float) else str(v)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _key_lines(items: Mapping[str, object]) -> list[str]:
    lines = []
    for key, v in items.items():
        if not key or "=" in key or any(c.isspace() for c in key):
            raise ValueError(f"bad metrics key {key!r}")
        lines.append(f"# {key}={_value(v)}\n")
    return lines


def preamble(config: Mapping[str, object]) -> str:
    """The format line, the configuration's ``key=value`` lines and the header row."""
    return FORMAT_LINE + "\n" + "".join(_key_lines(config)) + ",".join(COLUMNS) + "\n"


def _cell(v: float | int) -> str:
    return repr(round(v, 4)) if isinstance(v, float) else str(v)


def row_line(row: TokenRow) -> str:
    """One token's CSV row (the columns in ``COLUMNS`` order)."""
    return ",".join(_cell(getattr(row, c)) for c in COLUMNS) + "\n"


def trailer(summary: Mapping[str, object]) -> str:
    """``# summary`` and the run's ``key=value`` lines."""
    return SUMMARY_LINE + "\n" + "".join(_key_lines(summary))


def format_metrics(
    config: Mapping[str, object], rows: Iterable[TokenRow], summary: Mapping[str, object]
) -> str:
    """A whole file at once (the CLI writes the same pieces as the run goes)."""
    return preamble(config) + "".join(row_line(r) for r in rows) + trailer(summary)


# -- reading ---------------------------------------------------------------------------------


@attrs.frozen
class MetricsFile:
    """A parsed file: its configuration and summary as text, its rows by column name."""

    config: dict[str, str]
    columns: tuple[str, ...]
    rows: tuple[dict[str, float], ...]
    summary: dict[str, str]

    def column(self, name: str) -> list[float]:
        """One column's values (KeyError for a column the file lacks)."""
        if name not in self.columns:
            raise KeyError(name)
        return [r[name] for r in self.rows]

    def summary_float(self, key: str, default: float = NOT_MEASURED) -> float:
        text = self.summary.get(key)
        if text is None:
            return default
        if text in ("true", "false"):
            return 1.0 if text == "true" else 0.0
        return float(text)


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append({"n": "\n", "r": "\r"}.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_metrics(text: str) -> MetricsFile:
    """Read a ``bmoe_metrics v2`` text; unknown keys and extra columns are kept."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != FORMAT_LINE:
        raise MetricsFormatError(f"line 1: expected {FORMAT_LINE!r}, not a bmoe metrics file")
    config: dict[str, str] = {}
    summary: dict[str, str] = {}
    body: list[str] = []
    target = config
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if line.startswith("#"):
            content = line[1:].strip()
            if content == SUMMARY_LINE[1:].strip():
                target = summary
                continue
            key, eq, value = content.partition("=")
            if not eq:
                raise MetricsFormatError(f"line {n}: expected '# key=value', got {line!r}")
            target[key] = _unescape(value)
        elif target is summary:
            raise MetricsFormatError(f"line {n}: a data row after '# summary'")
        else:
            body.append(line)
    if not body:
        raise MetricsFormatError("no header row")
    reader = csv.reader(io.StringIO("\n".join(body)))
    header = tuple(next(reader))
    missing = [c for c in ("step", "wall_ms") if c not in header]
    if missing:
        raise MetricsFormatError(f"header lacks the column(s) {', '.join(missing)}")
    rows = []
    for i, cells in enumerate(reader, start=1):
        if len(cells) != len(header):
            raise MetricsFormatError(f"row {i}: {len(cells)} cells for {len(header)} columns")
        try:
            rows.append({h: float(c) for h, c in zip(header, cells, strict=True)})
        except ValueError as exc:
            raise MetricsFormatError(f"row {i}: {exc}") from None
    return MetricsFile(config=config, columns=header, rows=tuple(rows), summary=summary)


# -- the live display's figures --------------------------------------------------------------


@attrs.define
class ProgressTotals:
    """A run's figures summed as its tokens come (``add`` each ``Progress``): tokens, the
    decode tokens' wall time (the first token, sampled from the prefill's logits, left out),
    the expert requests, reads and wait for reads, and what copy drafts did. The CLI's ``--progress`` line
    (``RunningTotals``) and the server's live view (``bmoe.domain.live.LiveTotals``) show them."""

    tokens: int = 0
    steps: int = 0  # the most tokens the run will generate
    decode_s: float = 0.0
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    stall_s: float = 0.0
    streaming: bool = False
    drafts: DraftReport | None = None  # copy drafts so far (None: the run is not drafted)

    def add(self, p: Progress) -> None:
        self.tokens = p.step
        self.steps = p.steps
        if p.drafts is not None:
            self.drafts = p.drafts
        if p.step > 1:
            self.decode_s += p.wall_ms / 1000.0
        if p.stream is not None:
            self.streaming = True
            self.hits += p.stream.hits
            self.misses += p.stream.misses
            self.bytes_read += p.stream.bytes_read
            self.stall_s += p.stream.stall_s


@attrs.define
class RunningTotals(ProgressTotals):
    """What ``--progress`` shows as tokens come: tokens, decode rate, hit rate, MiB read.

    The rate leaves out the first token (sampled from the prefill's logits) as ``tok_s`` does;
    the hit rate and MiB cover the decode tokens' expert requests (-1 when not streaming).
    """

    @property
    def tok_s(self) -> float:
        return (self.tokens - 1) / self.decode_s if self.tokens > 1 and self.decode_s > 0 else 0.0

    @property
    def hit_pct(self) -> float:
        total = self.hits + self.misses
        return 100.0 * self.hits / total if total else NOT_MEASURED

    @property
    def read_mib(self) -> float:
        return self.bytes_read / MIB

    def line(self) -> str:
        """``progress: 12/32 tokens, 3.4 tok/s, 87.5% hit, 120.3 MiB read`` (streaming parts
        only when streaming)."""
        text = f"progress: {self.tokens}/{self.steps} tokens, {self.tok_s:.1f} tok/s"
        if self.streaming:
            hit = f"{self.hit_pct:.1f}% hit" if self.hit_pct >= 0 else "no expert requests"
            text += f", {hit}, {self.read_mib:.1f} MiB read"
        return text
