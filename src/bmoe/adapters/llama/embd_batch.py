"""A ``llama_batch`` of embedding rows (an image's, from the vision encoder), over arrays
that Python owns.

``llama_batch_init`` allocates one position per row; an M-RoPE model reads
``n_pos_per_embd`` per row, section by section (``pos[j * n + i]`` is row ``i``'s position
in section ``j``: llama.cpp's ``llama_batch_allocr``), so the batch is built here on numpy
arrays instead, kept alive as long as the batch.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import numpy.typing as npt


class EmbeddingBatch:
    """Rows ``[n, n_embd]`` (float32) at ``positions`` (``[n_sections, n]``, int32), in
    sequence ``seq``; logits for the last row only when ``last_logits``."""

    def __init__(
        self,
        rows: npt.NDArray[np.float32],
        positions: npt.NDArray[np.int32],
        seq: int,
        *,
        last_logits: bool,
    ) -> None:
        n = rows.shape[0]
        if positions.ndim != 2 or positions.shape[1] != n:
            raise ValueError(f"positions must be [sections, {n}], not {positions.shape}")
        self._embd = np.ascontiguousarray(rows, dtype=np.float32)
        self._pos = np.ascontiguousarray(positions, dtype=np.int32).ravel()  # section-major
        self._n_seq_id = np.ones(n, dtype=np.int32)
        self._seq = (llama_cpp.llama_seq_id * 1)(seq)
        self._seq_ids = (ctypes.POINTER(llama_cpp.llama_seq_id) * n)(*([self._seq] * n))
        self._logits = np.zeros(n, dtype=np.int8)
        self._logits[-1] = last_logits
        # llama-cpp-python types these fields as arrays; llama.cpp reads pointers
        batch = llama_cpp.llama_batch()
        batch.n_tokens = n
        fields = {
            "token": ctypes.POINTER(llama_cpp.llama_token)(),  # NULL: rows, not tokens
            "embd": self._embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            "pos": self._pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos)),
            "n_seq_id": self._n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            "seq_id": ctypes.cast(self._seq_ids, ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id))),
            "logits": self._logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        }
        for name, value in fields.items():
            setattr(batch, name, value)
        self.batch = batch

    @property
    def n_tokens(self) -> int:
        return int(self.batch.n_tokens)
