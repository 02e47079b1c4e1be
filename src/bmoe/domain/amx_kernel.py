"""Whether llama.cpp's own AMX kernel computes right here: the kernel probe's report, read.

The tile-instruction probe (``bmoe.cext.cpu_probe``) answers for the CPU; it cannot answer
for llama.cpp's kernel as this machine's compiler built it. gcc 12 compiles llama.cpp's
AMX kernel so that it loads an unconfigured tile config (its ``_tile_loadconfig`` takes an
8-byte memory operand, and the stores of the other 56 bytes are deleted): the tiles run
fine in bmoe's probe and llama.cpp dies of SIGILL or SIGSEGV in its first batched matmul.
So the kernel step runs what will run: a child process loads a small quantized model with
llama.cpp's default buffer types (AMX first), computes a batch with several thread counts,
and compares the logits with the same batch computed without extra buffer types.

The child writes one JSON object a line as it goes (``KernelEvent`` kinds below), so a
child that dies still says where it died; ``read_report`` turns the lines and the exit
status into a ``KernelReport``, and ``kernel_verdict`` decides. Everything here is pure:
the gates feed it reports of faults injected on any machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import attrs

from bmoe.domain.cpu_features import AmxVerdict

MAX_RELATIVE_ERROR = 0.02
"""Two correct kernels differ by rounding: the AMX kernel quantizes the activations per
block as the plain one does, and sums in another order; a kernel that computes with a wrong
tile configuration is off by the logits' own size. Measured: ``CPU_REPACK`` against the
plain kernels on the probe's models, 0.0 (clang 14 build, Xeon); a working AMX kernel has
not been measured here (none was at hand), so the bound is a guess kept wide."""

PROBE_TOKENS = 32
"""The batch the child computes: the AMX kernel takes batches (one token goes elsewhere)."""


@attrs.frozen
class KernelRun:
    """One batch computed with AMX holding the weights, against the plain kernels."""

    model: str
    threads: int
    relative_error: float
    same_tokens: bool

    @property
    def right(self) -> bool:
        return self.same_tokens and self.relative_error <= MAX_RELATIVE_ERROR


@attrs.frozen
class KernelReport:
    """- ``signal``: the signal the child died of ("SIGILL"), else "";
    - ``at``: what it was doing when it stopped (``"Q4_0, 3 threads"``), else "";
    - ``timed_out``: killed after the time limit;
    - ``status``: its exit status when it exited (0: finished), ``error`` its last words;
    - ``amx_bytes``: weight bytes llama.cpp placed in AMX, per model;
    - ``runs``: the batches it compared."""

    signal: str = ""
    at: str = ""
    timed_out: bool = False
    status: int = 0
    error: str = ""
    amx_bytes: tuple[tuple[str, int], ...] = ()
    runs: tuple[KernelRun, ...] = ()


def event_line(kind: str, **fields: object) -> str:
    """One line of the child's report."""
    return json.dumps({"event": kind, **fields}, sort_keys=True)


def read_report(
    lines: Iterable[str], *, signal: str = "", status: int = 0, timed_out: bool = False
) -> KernelReport:
    """The report from the child's lines (a torn last line ignored) and how it ended."""
    at = ""
    error = ""
    placed: list[tuple[str, int]] = []
    runs: list[KernelRun] = []
    for line in lines:
        try:
            event = json.loads(line)
            kind = event["event"]
            if kind == "computing":
                at = f"{event['model']}, {event['threads']} thread{'s' if event['threads'] != 1 else ''}"
            elif kind == "placed":
                placed.append((str(event["model"]), int(event["amx_bytes"])))
            elif kind == "run":
                runs.append(
                    KernelRun(
                        str(event["model"]),
                        int(event["threads"]),
                        float(event["relative_error"]),
                        bool(event["same_tokens"]),
                    )
                )
                at = ""
            elif kind == "error":
                error = str(event["message"])
        except (ValueError, KeyError, TypeError):
            continue
    return KernelReport(
        signal=signal, at=at, timed_out=timed_out, status=status, error=error,
        amx_bytes=tuple(placed), runs=tuple(runs),
    )  # fmt: skip


def kernel_verdict(report: KernelReport, tiles: AmxVerdict) -> AmxVerdict:
    """AMX usable only where the tiles ran (``tiles``) and llama.cpp's kernel, holding the
    weights, computed every batch right and the child finished."""
    if not tiles.usable:
        return tiles
    where = f" with {report.at}" if report.at else ""
    ran = tiles.why.startswith("the tile instructions ran")  # else: why they were not run
    tiles_ran = "the tile instructions alone ran right" if ran else tiles.why
    if report.signal:
        return AmxVerdict(
            False, f"llama.cpp's AMX kernel faulted in the probe ({report.signal}{where}; {tiles_ran})"
        )
    if report.timed_out:
        return AmxVerdict(
            False, f"llama.cpp's AMX kernel did not finish in the probe's time ({report.at or 'loading'})"
        )
    if report.status != 0:
        said = f": {report.error}" if report.error else ""
        return AmxVerdict(False, f"llama.cpp's AMX kernel probe failed (exit status {report.status}){said}")
    wrong = [run for run in report.runs if not run.right]
    if wrong:
        run = wrong[0]
        tokens = "" if run.same_tokens else ", other tokens"
        what = f"relative error {run.relative_error:.2g}{tokens}"
        return AmxVerdict(
            False,
            f"llama.cpp's AMX kernel computed wrong logits ({run.model}, {run.threads} threads: {what})",
        )
    if not report.runs:
        return AmxVerdict(False, "llama.cpp's AMX kernel probe computed nothing")
    if not report.amx_bytes or not all(n > 0 for _, n in report.amx_bytes):
        return AmxVerdict(
            False, "llama.cpp placed no weight of the probe's model in AMX: its kernel is untested"
        )
    threads = ", ".join(map(str, sorted({run.threads for run in report.runs})))
    models = ", ".join(dict.fromkeys(run.model for run in report.runs))
    why = f"llama.cpp's AMX kernel computed {models} right with {threads} threads; {tiles.why}"
    return AmxVerdict(True, why)
