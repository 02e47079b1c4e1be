"""What makes streaming stop for good: a failed read, or a graph it does not understand."""

from __future__ import annotations

import os

import attrs

from bmoe.errors import ExpertGraphError, ExpertReadError


@attrs.frozen
class ReadFault:
    """A read of an expert's bytes failed (an I/O error, a short read past the end of a
    truncated file, a file replaced under the session). Sticky: once a source has one,
    every later read fails with it. ``tensor``: the tensor whose bytes were read, where known."""

    path: str
    offset: int
    errno: int
    detail: str = ""
    tensor: str = ""

    def message(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        where = f" ({self.tensor})" if self.tensor else ""
        return (
            f"expert read failed: {self.path} at offset {self.offset}{where}: {os.strerror(self.errno)}{why}"
        )

    def error(self) -> ExpertReadError:
        return ExpertReadError(self.message())


@attrs.frozen
class GraphFault:
    """The compute graph asked for something the streaming engine cannot serve (a routing
    node of a layer with no known experts, an expert id out of range, ids of a type it
    does not read). Computing on would use experts that were never read."""

    layer: int
    reason: str

    def message(self) -> str:
        return f"expert streaming cannot serve layer {self.layer}: {self.reason}"

    def error(self) -> ExpertGraphError:
        return ExpertGraphError(self.message())


StreamFault = ReadFault | GraphFault
