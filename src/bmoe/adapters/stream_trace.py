"""``--route-trace FILE`` and ``--io-trace FILE``: the streamer's rows as CSV (docs/telemetry.md).

The C streamer keeps the rows; ``TraceFiles.drain(turn)`` takes them after each request and
writes them with the request's number (``turn``, from 1), its ``phase`` (``prefill``: a
ubatch of several tokens; ``decode``: one token) and ``step`` (the ubatch's number within
that phase of the turn: the decode step for decode).

- route trace: ``turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped``
  (one row per routed slot after any rewrite; a prefill slot is ``token * top_k + slot``;
  ``weight`` is the routing weight normalised over the token's selection, -1 where the
  router's probabilities could not be read; ``residency`` 0 miss, 1 hit, 2 hit on a read
  ahead; ``dropped`` 1 when ``--drop-cold-experts`` did not read it);
- I/O trace: ``turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns``
  (one row per projection read; ``spec`` 1 for a read ahead; ``read_bytes`` is what the disk
  delivered, rounded out to O_DIRECT's blocks).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from bmoe.cext import expert_stream

ROUTE_COLUMNS = (
    "turn",
    "phase",
    "step",
    "layer",
    "slot",
    "expert",
    "weight",
    "residency",
    "expert_bytes",
    "dropped",
)
IO_COLUMNS = (
    "turn",
    "phase",
    "step",
    "layer",
    "expert",
    "proj",
    "lane",
    "spec",
    "offset",
    "req_bytes",
    "read_bytes",
    "latency_ns",
)


class TraceFiles:
    """The open trace files of one session (either may be None)."""

    def __init__(
        self,
        streamer: expert_stream.ExpertStreamer,
        entry_bytes: Sequence[int],
        route: Path | None,
        io: Path | None,
    ) -> None:
        self._streamer = streamer
        self._entry_bytes = list(entry_bytes)
        self._files: list[IO[str]] = []
        self._route = self._open(route, ROUTE_COLUMNS)
        self._io = self._open(io, IO_COLUMNS)
        self._where: dict[int, tuple[int, str, int]] = {}  # ubatch -> (turn, phase, step)
        self.io_lost = 0
        streamer.enable_traces(route=route is not None, io=io is not None)

    def _open(self, path: Path | None, columns: tuple[str, ...]) -> Any:
        if path is None:
            return None
        f = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115  # closed by close()
        self._files.append(f)
        writer = csv.writer(f)
        writer.writerow(columns)
        return writer

    def drain(self, turn: int) -> None:
        """Write the rows recorded since the last drain as request ``turn``'s."""
        rows = self._streamer.drain_traces()
        steps = {"prefill": 0, "decode": 0}
        for number, n_tokens in rows["ubatches"]:
            phase = "prefill" if n_tokens > 1 else "decode"
            self._where[number] = (turn, phase, steps[phase])
            steps[phase] += 1
        top_k = max((r[3] for r in rows["route"]), default=0) + 1
        if self._route is not None:
            for ubatch, token, layer, slot, expert, weight, residency, dropped in rows["route"]:
                t, phase, step = self._where.get(ubatch, (turn, "decode", 0))
                self._route.writerow(
                    (
                        t,
                        phase,
                        step,
                        layer,
                        token * top_k + slot,
                        expert,
                        f"{weight:.6g}",
                        residency,
                        self._entry_bytes[layer],
                        dropped,
                    )
                )
        if self._io is not None:
            for ubatch, layer, proj, expert, lane, spec, offset, req, got, ns in rows["io"]:
                t, phase, step = self._where.get(ubatch, (turn, "decode", 0))
                self._io.writerow((t, phase, step, layer, expert, proj, lane, spec, offset, req, got, ns))
        self.io_lost += rows["io_lost"]
        for f in self._files:
            f.flush()
        if self._where and len(self._where) > 4096:  # keep only the recent ubatches
            for key in sorted(self._where)[:-64]:
                del self._where[key]

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []
