"""The small quantized models the AMX kernel probe computes (``bmoe.adapters.amx_kernel``).

Two synthetic ``qwen3moe`` models, one quantized Q4_0 everywhere and one Q8_0 (both types
llama.cpp's AMX kernel takes), whose dense matrices have the shapes its AMX buffer type
accepts (output features a multiple of 32, rows of whole blocks). Generated on first use
into bmoe's fixture folder and reused (``bmoe.adapters.cache_dirs``: a few hundred KiB).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import attrs

from bmoe.adapters.cache_dirs import fixture_dir
from bmoe.tinymodel.spec import GENERATOR_VERSION
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

PROBE_SHAPE = SyntheticShape(
    n_layer=1, n_embd=256, n_ff_exp=256, n_expert=4, n_expert_used=2, head_dim=64, n_ctx_train=256
)
PROBE_QUANTS = ("q4_0", "q8_0")
_SEED = 11


def probe_models() -> list[tuple[str, Path]]:
    """``(name, path)`` of each probe model ("Q4_0", "Q8_0"), written where missing."""
    folder = fixture_dir() / f"v{GENERATOR_VERSION}" / "amx-probe"
    out = []
    for quant in PROBE_QUANTS:
        path = folder / f"{quant}.gguf"
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{quant}.", suffix=".gguf", dir=folder)
            os.close(fd)
            try:
                shape = attrs.evolve(PROBE_SHAPE, quant=quant)
                write_synthetic(Path(tmp), shape, seed=_SEED, progress=False)
                os.replace(tmp, path)  # atomic: a concurrent writer's identical file may win
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        out.append((quant.upper(), path))
    return out
