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
    - ``streaming_load``: a model loaded for streaming that runs resident (its weights stay
      in the file's layout).
    """

    asked: bool
    available: bool = False
    by_llama: bool = False
    dense_tensors: int = 0
    dense_bytes: int = 0
    expert_tensors: int = 0
    expert_tensors_total: int = 0
    streaming_load: bool = False

    @property
    def repacked(self) -> bool:
        """Some weight computes in the repacked layout."""
        return bool(self.dense_bytes or self.dense_tensors or self.expert_tensors)

    def summary(self) -> str:
        """``weights repacked (...)``, or why they are in the file's layout."""
        if not self.asked:
            return "weights in the file's layout (--no-repack)"
        if self.streaming_load:
            return "weights in the file's layout (loaded for streaming)"
        if not self.available:
            return "weights in the file's layout (this llama.cpp has no CPU_REPACK buffer type)"
        if not self.repacked:
            return "weights in the file's layout (no weight of this model has a repacked form on this CPU)"
        if self.by_llama:
            return f"weights repacked by llama.cpp at load (CPU_REPACK {self.dense_bytes / MIB:.1f} MiB)"
        return (
            f"weights repacked (dense {self.dense_tensors} tensors, {self.dense_bytes / MIB:.1f} MiB; "
            f"experts {self.expert_tensors} of {self.expert_tensors_total} tensors, as read)"
        )
