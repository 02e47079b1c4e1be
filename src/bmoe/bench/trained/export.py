"""Given weight arrays, write a ``qwen3moe`` GGUF llama.cpp loads like a real one.

The tiny models' conventions (:mod:`bmoe.tinymodel.writer`): their byte-level BPE
tokenizer and chat template, their hyper-parameter keys, gguf-py's tensor names. Every
tensor is F32, so llama.cpp computes with the exact trained values and its logits can be
compared with a float32 forward pass; except those given as ``raw`` Q4_0 bytes (the
bench-scale export, :mod:`~bmoe.bench.trained.padded`). The file is written under a
temporary name and renamed into place.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quant_shape_to_byte_shape

from bmoe.adapters.file_writes import replacing
from bmoe.bench.trained.layout import TrainedDims, Weights, check_weights, expected_shapes
from bmoe.tinymodel.archs.common import add_common_hparams
from bmoe.tinymodel.archs.qwen3moe import ARCH
from bmoe.tinymodel.tokenizer import build_vocab
from bmoe.tinymodel.writer import add_tokenizer

Meta = Mapping[str, str | int | float]
"""Extra ``bmoe.trained.*`` keys (provenance: seed, steps, corpus bytes ...)."""

KEY_PREFIX = "bmoe.trained."


def write_gguf(
    path: Path,
    dims: TrainedDims,
    weights: Weights,
    *,
    name: str = "trained-moe",
    description: str = "qwen3moe trained by python -m bmoe.bench.trained",
    meta: Meta | None = None,
    raw: Mapping[str, npt.NDArray[np.uint8]] | None = None,
    file_type: LlamaFileType = LlamaFileType.ALL_F32,
) -> Path:
    """Write ``weights`` as ``path``; returns ``path``. The tensors in ``raw`` are written as
    the Q4_0 bytes given (their shapes checked against ``dims``), the others from
    ``weights`` in F32 (all checked against ``dims`` when ``raw`` is empty)."""
    raw = raw or {}
    shapes = expected_shapes(dims)
    if not raw:
        check_weights(dims, weights)
    for name, data in raw.items():
        want = quant_shape_to_byte_shape(shapes[name], GGMLQuantizationType.Q4_0)
        if data.shape != want or data.dtype != np.uint8:
            raise ValueError(f"{name}: expected Q4_0 bytes {want}, got {data.dtype} {data.shape}")
    path = Path(path)
    with replacing(path, f"the trained model {path.name}") as tmp:
        writer = GGUFWriter(tmp, ARCH)
        writer.add_name(name)
        writer.add_description(description)
        writer.add_file_type(file_type)
        for key, value in (meta or {}).items():
            _add_meta(writer, KEY_PREFIX + key, value)
        add_tokenizer(writer, build_vocab())
        add_common_hparams(writer, dims.moe_dims())
        for tensor in shapes:
            if tensor in raw:
                writer.add_tensor(tensor, raw[tensor], raw_dtype=GGMLQuantizationType.Q4_0)
            else:
                writer.add_tensor(tensor, np.ascontiguousarray(weights[tensor], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=False)
        writer.close()
    return path


def _add_meta(writer: GGUFWriter, key: str, value: str | int | float) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f"{key}: metadata must be str, int or float, not {type(value).__name__}")
    if isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, int) and value >= 0:
        writer.add_uint64(key, value)
    elif isinstance(value, int):
        writer.add_int64(key, value)
    else:
        writer.add_float64(key, value)
