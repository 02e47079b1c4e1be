"""llama.cpp's logits on the exported file, held against a reference forward pass.

llama.cpp runs through bmoe's own owner classes with what makes an oracle comparable (see
:mod:`bmoe.adapters.llama.model`): the file memory-mapped, weight repacking off, flash
attention off, nothing offloaded, and an F32 KV cache. llama.cpp's default F16 cache alone
moved logits by up to 7.7e-2 (the 16-layer model at 2,048 positions; 1.5e-4 with F32), its
rounding growing with depth and context; a wrong layout, norm or rope moves them by whole
units.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel, ModelParams

F32 = npt.NDArray[np.float32]

DEFAULT_TOLERANCE = 2e-2
"""Largest absolute logit difference accepted between llama.cpp and a float32/float64
reference on the same weights, for the default 6-layer model."""
TOLERANCE_LAYERS = 6


def depth_tolerance(n_layer: int) -> float:
    """``DEFAULT_TOLERANCE`` grown with the depth past 6 layers: set when the check ran an F16
    KV cache, whose rounding compounds layer by layer (the 16-layer bench model: max 3.2e-2,
    mean 8.7e-5, every argmax the same, against torch); kept as the bound with F32."""
    return DEFAULT_TOLERANCE * max(1.0, n_layer / TOLERANCE_LAYERS)


def llama_logits(path: Path, windows: Sequence[Sequence[int]], *, n_threads: int = 2) -> list[F32]:
    """Every token's logits, ``[len(window), n_vocab]`` per window, each window a fresh
    sequence from position 0."""
    n_ctx = max(len(w) for w in windows)
    params = ContextParams(
        n_ctx=max(n_ctx, 8),
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=n_threads,
        flash_attn="off",
        cache_type_k="f32",
        cache_type_v="f32",
    )
    out: list[F32] = []
    with LlamaModel(path, ModelParams()) as model, LlamaContext(model, params) as ctx:
        for window in windows:
            ctx.clear()
            out.append(ctx.decode_all_rows(list(window), 0))
    return out


@attrs.frozen
class LogitCheck:
    """How far llama.cpp's logits are from the reference's."""

    max_abs_diff: float
    mean_abs_diff: float
    argmax_agreement: float
    """Fraction of tokens whose most likely next token is the same on both sides."""
    n_tokens: int
    tolerance: float
    mean_tolerance: float | None = None
    """Where set, the mean difference is held to it too (and ``tolerance`` only catches a
    wrong layout): quantized weights, whose matmuls llama.cpp computes on Q8_0 activations."""
    label: str = "llama.cpp vs reference"

    @property
    def ok(self) -> bool:
        mean_ok = self.mean_tolerance is None or self.mean_abs_diff <= self.mean_tolerance
        return self.max_abs_diff <= self.tolerance and mean_ok

    def text(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        mean_tolerance = "" if self.mean_tolerance is None else f", mean {self.mean_tolerance:.0e}"
        return (
            f"{self.label} logits on {self.n_tokens} tokens: max |diff| {self.max_abs_diff:.2e}, "
            f"mean {self.mean_abs_diff:.2e}, argmax agree {self.argmax_agreement:.2%} "
            f"(tolerance {self.tolerance:.0e}{mean_tolerance}): {verdict}"
        )


def compare(
    reference: Sequence[F32],
    llama: Sequence[F32],
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    mean_tolerance: float | None = None,
    label: str = "llama.cpp vs reference",
) -> LogitCheck:
    """Compare two lists of per-window logits of the same shapes."""
    if len(reference) != len(llama) or not reference:
        raise ValueError(f"need the same non-zero number of windows, got {len(reference)} and {len(llama)}")
    for a, b in zip(reference, llama, strict=True):
        if a.shape != b.shape:
            raise ValueError(f"logit shapes differ: {a.shape} vs {b.shape}")
    ref = np.concatenate([np.asarray(r, dtype=np.float64) for r in reference])
    got = np.concatenate([np.asarray(g, dtype=np.float64) for g in llama])
    diff = np.abs(ref - got)
    return LogitCheck(
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        argmax_agreement=float(np.mean(ref.argmax(axis=-1) == got.argmax(axis=-1))),
        n_tokens=int(ref.shape[0]),
        tolerance=tolerance,
        mean_tolerance=mean_tolerance,
        label=label,
    )
