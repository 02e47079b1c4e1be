"""``LlamaDecideProbe``: ``IDecideProbe`` over a llama.cpp context and a JSON-lines file.

The C eval callback (``bmoe.cext.probe.DecideProbe``) is installed in the context in place
of the callback the context would otherwise have (the expert streamer's, or none), which it
wraps and forwards every call to: streaming sees exactly the calls it saw without the probe.
A session without ``--decide-probe`` creates none of this (no callback, no file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import llama_cpp

from bmoe.adapters.llama.context import CCallback
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.output_head import GgufOutputHead
from bmoe.cext.probe import DecideProbe
from bmoe.domain.decide.probe import ProbeObservation, ProbeRecord
from bmoe.errors import ConfigError
from bmoe.ports.decide_probe import IDecideProbe


def probe_line(record: ProbeRecord) -> str:
    """One record as the file holds it: compact JSON, one line."""
    return json.dumps(record.as_json(), separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"


class LlamaDecideProbe(IDecideProbe):
    """Owns the C callback, the model's output head and the file; ``close()`` them."""

    def __init__(self, native: DecideProbe, head: GgufOutputHead, out: TextIO, path: Path) -> None:
        self.native = native
        self.head = head
        self._out = out
        self._path = path
        self._seq = 0

    @classmethod
    def open(cls, model: LlamaModel, n_ubatch: int, path: Path, inner: CCallback | None) -> LlamaDecideProbe:
        """The probe of ``model``'s contexts of ubatch ``n_ubatch``, appending to ``path``,
        chained to ``inner`` (None: the probe is the context's only callback). Raises
        ``ConfigError`` when the file cannot be opened or the output head not read."""
        native = DecideProbe(
            n_layer=model.n_layer,
            n_embd=int(llama_cpp.llama_model_n_embd(model.ptr)),
            n_expert=model.n_expert,
            max_routings=n_ubatch * max(1, model.n_expert),  # k <= n_expert, whatever the override
            inner=inner,
        )
        head = GgufOutputHead(model.path, model.arch)
        try:
            out = path.open("a", encoding="utf-8")
        except OSError as exc:
            head.close()
            raise ConfigError(f"--decide-probe: cannot open {path}: {exc.strerror}") from None
        return cls(native, head, out, path)

    @property
    def callback(self) -> CCallback:
        """What the context installs as its eval callback."""
        return self.native

    def begin(self) -> None:
        self.native.reset()
        self.native.armed = True

    def end(self) -> None:
        self.native.armed = False

    def observation(self, choice_tokens: Sequence[int]) -> ProbeObservation:
        states, seen = self.native.states()
        cnt, wsum, nu = self.native.routing()
        observed = ProbeObservation(
            seq=self._seq,
            states=states,
            seen=seen,
            head=self.head.output,
            rows=self.head.rows(choice_tokens),
            cnt=cnt,
            wsum=wsum,
            nu=nu,
        )
        self._seq += 1
        return observed

    def write(self, record: ProbeRecord) -> None:
        try:
            self._out.write(probe_line(record))
            self._out.flush()
        except OSError as exc:
            raise ConfigError(f"--decide-probe: cannot write {self._path}: {exc.strerror}") from None

    def close(self) -> None:
        """Close the file and the model files (the callback lives as long as the context)."""
        self.head.close()
        self._out.close()
