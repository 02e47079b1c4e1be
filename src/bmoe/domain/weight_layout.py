"""Which weights compute in llama.cpp's repacked layout (``CPU_REPACK``), for the ``mode:``
line and ``BMOE_READY``.

Resident, llama.cpp repacks at load (stock's default); streamed, bmoe repacks the same
weights itself (the dense ones once, each routed expert as it is read). ``--no-repack``
keeps the file's layout everywhere.
"""

from __future__ import annotations

import attrs

MIB = 1048576


@attrs.frozen
class WeightLayout:
    """- ``asked``: repacking was asked for (False: ``--no-repack``);
    - ``available``: this llama.cpp has the ``CPU_REPACK`` buffer type;
    - ``by_llama``: llama.cpp repacked at load (resident); else bmoe did (streamed);
    - ``dense_tensors`` / ``dense_bytes``: dense weights repacked (``by_llama``: ``dense_bytes``
      is every repacked byte, llama.cpp's ``CPU_REPACK`` buffer);
    - ``expert_tensors`` of ``expert_tensors_total``: routed-expert tensors written repacked;
    - ``buffers``: ``(buffer type, bytes)`` of the weights in llama.cpp's extra buffer types
      (``CPU_REPACK``, ``AMX``), where more than ``CPU_REPACK`` alone is known;
    - ``resident``: bmoe placed a resident model's weights itself (AMX refused, or a load for
      streaming that runs resident), dense and experts alike, ``dense_tensors`` /
      ``dense_bytes`` counting them all;
    - ``note``: one line on a buffer type refused (``AMX refused: ...``), else "".
    """

    asked: bool
    available: bool = False
    by_llama: bool = False
    dense_tensors: int = 0
    dense_bytes: int = 0
    expert_tensors: int = 0
    expert_tensors_total: int = 0
    buffers: tuple[tuple[str, int], ...] = ()
    resident: bool = False
    note: str = ""

    @property
    def repacked(self) -> bool:
        """Some weight computes in the repacked layout."""
        return bool(self.dense_bytes or self.dense_tensors or self.expert_tensors)

    def summary(self) -> str:
        """``weights repacked (...)``, or why they are in the file's layout; then the note on
        a refused buffer type, if any."""
        text = self._where()
        return f"{text}; {self.note}" if self.note else text

    def _in_types(self, total: int) -> str:
        """``CPU_REPACK 1.5 MiB``, or each buffer type's share where there are several."""
        if len(self.buffers) <= 1:
            name = self.buffers[0][0] if self.buffers else "CPU_REPACK"
            return f"{name} {total / MIB:.1f} MiB"
        return ", ".join(f"{name} {n / MIB:.1f} MiB" for name, n in self.buffers)

    def _where(self) -> str:
        if not self.asked:
            return "weights in the file's layout (--no-repack)"
        if not self.available:
            return "weights in the file's layout (this llama.cpp has no CPU_REPACK buffer type)"
        if not self.repacked:
            return "weights in the file's layout (no weight of this model has a repacked form on this CPU)"
        if self.by_llama:
            return f"weights repacked by llama.cpp at load ({self._in_types(self.dense_bytes)})"
        if self.resident:
            where = self._in_types(self.dense_bytes)
            return f"weights repacked by bmoe at load ({self.dense_tensors} tensors, {where})"
        dense = f"{self.dense_bytes / MIB:.1f} MiB"
        if len(self.buffers) > 1:
            dense += f": {self._in_types(self.dense_bytes)}"
        return (
            f"weights repacked (dense {self.dense_tensors} tensors, {dense}; "
            f"experts {self.expert_tensors} of {self.expert_tensors_total} tensors, as read)"
        )
