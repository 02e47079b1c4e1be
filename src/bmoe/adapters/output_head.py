"""The model's output head read from its GGUF files, for the decide probe's lens.

The final norm (``output_norm.weight``, and ``output_norm.bias`` when the model has one), the
head (``output.weight``, or ``token_embd.weight`` when the embeddings are tied) and the
logit transforms llama.cpp applies after the head, as :class:`bmoe.domain.decide.probe.OutputHead`
wants them. The head is never loaded whole: ``rows(tokens)`` reads just those rows from the
file and dequantizes them with the ``gguf`` package (``gguf.quants.dequantize``), whatever
the tensor's type.

Metadata and tensor types come from ggml's own GGUF parser (as in ``gguf_layout``): floats
exactly as stored (llama.cpp's text form of a float metadata value keeps 6 decimals).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from bmoe.adapters.gguf_layout import (
    ModelLayout,
    TensorLocation,
    _InitParams,  # ggml's parser, set up once there
    _libggml_base,
    read_layout,
)
from bmoe.domain.decide.probe import NormKind, OutputHead
from bmoe.errors import ConfigError

_GGUF_TYPE_FLOAT32 = 6
_GGUF_TYPE_FLOAT64 = 12


def _read_gguf(
    path: Path, floats: Sequence[str], tensors: Sequence[str]
) -> tuple[dict[str, float], dict[str, int]]:
    """The float metadata ``floats`` and the ggml types of ``tensors`` found in one file."""
    lib = _libggml_base()
    ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
    if not ctx:
        raise ConfigError(f"--decide-probe: not a readable GGUF file: {path}")
    values: dict[str, float] = {}
    types: dict[str, int] = {}
    try:
        for key in floats:
            kid = int(lib.gguf_find_key(ctx, key.encode()))
            kind = int(lib.gguf_get_kv_type(ctx, kid)) if kid >= 0 else -1
            if kind == _GGUF_TYPE_FLOAT32:
                values[key] = float(lib.gguf_get_val_f32(ctx, kid))
            elif kind == _GGUF_TYPE_FLOAT64:
                values[key] = float(lib.gguf_get_val_f64(ctx, kid))
        for name in tensors:
            tid = int(lib.gguf_find_tensor(ctx, name.encode()))
            if tid >= 0:
                types[name] = int(lib.gguf_get_tensor_type(ctx, tid))
    finally:
        lib.gguf_free(ctx)
    return values, types


def logit_scale_factor(arch: str, logit_scale: float | None) -> float:
    """What llama.cpp multiplies the logits by: granite models divide by their
    ``logit_scale``, the others that have one (command-r, cohere2, grok, ...) multiply."""
    if not logit_scale:
        return 1.0
    return 1.0 / logit_scale if arch.startswith("granite") else logit_scale


class _Tensor:
    """One tensor's bytes in its file, read a row at a time."""

    def __init__(self, layout: ModelLayout, where: TensorLocation, ggml_type: int) -> None:
        self.name = where.name
        self.path = layout.paths[where.file_index]
        self.offset = where.offset
        self.qtype = gguf.GGMLQuantizationType(ggml_type)
        self.n_cols = where.shape[0]
        self.n_rows = where.n_bytes // self.row_bytes if self.row_bytes else 0

    @property
    def row_bytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return self.n_cols // block * size

    def rows(self, fd: int, indices: Sequence[int]) -> npt.NDArray[np.float32]:
        out = np.empty((len(indices), self.n_cols), dtype=np.float32)
        for i, index in enumerate(indices):
            if not 0 <= index < self.n_rows:
                raise ConfigError(f"--decide-probe: row {index} is outside {self.name} ({self.n_rows} rows)")
            raw = os.pread(fd, self.row_bytes, self.offset + index * self.row_bytes)
            if len(raw) != self.row_bytes:
                raise ConfigError(f"--decide-probe: {self.path} ends inside {self.name}")
            out[i] = gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8), self.qtype).reshape(-1)
        return out


class GgufOutputHead:
    """The output head of a model's files; ``close()`` the descriptors it keeps open."""

    def __init__(self, first: Path, arch: str) -> None:
        layout = read_layout(Path(first))
        names = ["output_norm.weight", "output_norm.bias", "output.weight", "token_embd.weight"]
        keys = {
            "rms_eps": f"{arch}.attention.layer_norm_rms_epsilon",
            "eps": f"{arch}.attention.layer_norm_epsilon",
            "logit_scale": f"{arch}.logit_scale",
            "softcap": f"{arch}.final_logit_softcapping",
        }
        values, types = _read_gguf(layout.paths[0], list(keys.values()), [])
        for index, path in enumerate(layout.paths):
            wanted = [n for n in names if n in layout.tensors and layout.tensors[n].file_index == index]
            if wanted:
                types.update(_read_gguf(path, [], wanted)[1])
        head_name = "output.weight" if "output.weight" in types else "token_embd.weight"
        if "output_norm.weight" not in types or head_name not in types:
            raise ConfigError(f"--decide-probe: {first.name} has no output_norm.weight or no output head")
        kind: NormKind = "rms" if keys["rms_eps"] in values or keys["eps"] not in values else "layer"
        self._fds: dict[Path, int] = {}
        try:
            norm = self._tensor(layout, "output_norm.weight", types)
            bias = None
            if "output_norm.bias" in types:
                bias = self._read(self._tensor(layout, "output_norm.bias", types), [0])[0]
            self.head = self._tensor(layout, head_name, types)
            self.output = OutputHead(
                norm_weight=self._read(norm, [0])[0],
                eps=values.get(keys["rms_eps"] if kind == "rms" else keys["eps"], 1e-6),
                norm_kind=kind,
                norm_bias=bias,
                logit_scale=logit_scale_factor(arch, values.get(keys["logit_scale"])),
                softcap=values.get(keys["softcap"], 0.0),
            )
        except BaseException:
            self.close()
            raise

    def _tensor(self, layout: ModelLayout, name: str, types: dict[str, int]) -> _Tensor:
        try:
            return _Tensor(layout, layout.tensors[name], types[name])
        except (KeyError, ValueError) as exc:  # a ggml type the gguf package does not know
            raise ConfigError(f"--decide-probe: cannot read {name}: {exc}") from None

    def _read(self, tensor: _Tensor, indices: Sequence[int]) -> npt.NDArray[np.float32]:
        if tensor.path not in self._fds:
            try:
                self._fds[tensor.path] = os.open(tensor.path, os.O_RDONLY)
            except OSError as exc:
                raise ConfigError(f"--decide-probe: cannot read {tensor.path}: {exc.strerror}") from None
        try:
            return tensor.rows(self._fds[tensor.path], indices)
        except OSError as exc:
            raise ConfigError(f"--decide-probe: cannot read {tensor.path}: {exc.strerror}") from None

    @property
    def head_name(self) -> str:
        """``output.weight``, or ``token_embd.weight`` for a model whose embeddings are tied."""
        return self.head.name

    def rows(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """The head rows of ``tokens``, ``[len(tokens), n_embd]`` float32. Raises
        ``ConfigError`` for a token outside the head or a file that cannot be read."""
        return self._read(self.head, tokens)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
