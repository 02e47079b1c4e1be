"""The trained model at bench scale: each expert padded with zeros to a real model's size and
quantized to Q4_0, so streaming it reads what a real model's expert reads.

The trained experts are narrow (``n_ff_exp`` 128 on a 256-wide model: 96 KiB in F32, a few
dozen KiB in Q4_0); a real model's are MiBs (the bench model's 2048 x 768 Q4_0 projections:
2.5 MiB an expert, three projections). Padding the hidden width with zeros changes nothing
the model computes:

- the gate and up projections (``[n_expert, n_ff, n_embd]``) gain rows of zeros: their
  outputs there are exactly 0, and ``silu(0) * 0 = 0``;
- the down projection (``[n_expert, n_embd, n_ff]``) gains columns of zeros, which multiply
  those zero activations: each output sums the trained terms and exact zeros.

In Q4_0 (blocks of 32 values along a row: an f16 scale, then 16 bytes of 4-bit codes) a
block of zeros is all-zero bytes (scale 0), so the padding is written straight into the
quantized tensors: the trained part is quantized as it is (``n_embd`` and ``n_ff_exp`` are
multiples of 32), then the zero blocks follow. Routing, the router and the dense part are the
trained model's, unpadded, in F32.

What it is not: its dense part is the trained model's (256 wide), so a token's compute is far
below a real model's of the same expert size; only its reads are a real model's.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, LlamaFileType
from gguf.quants import dequantize, quantize

from bmoe.bench.trained.export import Meta, write_gguf
from bmoe.bench.trained.layout import F32, TrainedDims, Weights, layer_names

QK = 32  # values per Q4_0 block
Q4_0_BLOCK_BYTES = 18
BENCH_EXPERT_VALUES = 2048 * 768
"""Values of one projection of one of the bench model's experts (its 2048 x 768 matrices)."""

U8 = npt.NDArray[np.uint8]


def bench_width(n_embd: int, values: int = BENCH_EXPERT_VALUES) -> int:
    """The hidden width that gives a ``n_embd``-wide model's expert projections ``values``
    values each (a multiple of 32), so its experts read as many bytes as the bench model's."""
    width = values // n_embd
    return max(QK, width - width % QK)


def _quantized_rows(values: F32) -> U8:
    """Q4_0 bytes of ``values`` (last axis a multiple of 32): ``[..., n / 32 * 18]``."""
    return np.asarray(quantize(np.ascontiguousarray(values, dtype=np.float32), GGMLQuantizationType.Q4_0))


def pad_rows(quantized: U8, rows: int) -> U8:
    """``[n_expert, n_ff, row_bytes]`` gate/up bytes with zero rows up to ``rows``."""
    n_expert, n_ff, row_bytes = quantized.shape
    if rows < n_ff:
        raise ValueError(f"cannot pad {n_ff} rows down to {rows}")
    out = np.zeros((n_expert, rows, row_bytes), dtype=np.uint8)
    out[:, :n_ff] = quantized
    return out


def pad_columns(quantized: U8, columns: int) -> U8:
    """``[n_expert, n_embd, n_ff / 32 * 18]`` down bytes with zero blocks up to ``columns``
    values a row."""
    n_expert, n_embd, row_bytes = quantized.shape
    if columns % QK or columns * Q4_0_BLOCK_BYTES // QK < row_bytes:
        raise ValueError(f"cannot pad rows of {row_bytes} bytes to {columns} values")
    out = np.zeros((n_expert, n_embd, columns * Q4_0_BLOCK_BYTES // QK), dtype=np.uint8)
    out[:, :, :row_bytes] = quantized
    return out


@attrs.frozen(eq=False)
class PaddedExperts:
    """The experts, quantized and padded (``raw``: GGUF name to Q4_0 bytes), and the trained
    weights as the file computes them (``computed``: the experts dequantized at the trained
    width, the rest as trained): what a reference forward pass must use."""

    raw: dict[str, U8]
    computed: dict[str, F32]
    width: int


def pad_experts(dims: TrainedDims, weights: Weights, width: int) -> PaddedExperts:
    """Quantize every layer's experts to Q4_0 and pad their hidden width to ``width``."""
    if dims.n_embd % QK or dims.n_ff_exp % QK or width % QK or width < dims.n_ff_exp:
        raise ValueError(
            f"Q4_0 padding needs n_embd ({dims.n_embd}), n_ff_exp ({dims.n_ff_exp}) and the padded width "
            f"({width}) to be multiples of {QK}, the width at least n_ff_exp"
        )
    raw: dict[str, U8] = {}
    computed = {name: np.asarray(array, dtype=np.float32) for name, array in weights.items()}
    for il in range(dims.n_layer):
        n = layer_names(il)
        for name in (n.gate_exps, n.up_exps, n.down_exps):
            q = _quantized_rows(weights[name])
            computed[name] = np.asarray(dequantize(q, GGMLQuantizationType.Q4_0), dtype=np.float32)
            raw[name] = pad_columns(q, width) if name == n.down_exps else pad_rows(q, width)
    return PaddedExperts(raw=raw, computed=computed, width=width)


def write_padded_gguf(
    path: Path, dims: TrainedDims, weights: Weights, width: int, *, meta: Meta | None = None
) -> tuple[Path, dict[str, F32]]:
    """Write the bench-scale file (experts Q4_0, padded to ``width``); returns its path and
    the weights it computes with (for the reference check)."""
    padded = pad_experts(dims, weights, width)
    wide = attrs.evolve(dims, n_ff_exp=width)
    written = write_gguf(
        path,
        wide,
        weights,
        name="trained-moe-bench",
        description=(
            f"qwen3moe trained by python -m bmoe.bench.trained ({dims.n_ff_exp}-wide experts), each expert "
            f"padded with zeros to {width} and quantized to Q4_0: a real model's expert bytes"
        ),
        meta={**(meta or {}), "trained_n_ff_exp": dims.n_ff_exp, "padded_n_ff_exp": width},
        raw=padded.raw,
        file_type=LlamaFileType.MOSTLY_Q4_0,
    )
    return written, padded.computed
