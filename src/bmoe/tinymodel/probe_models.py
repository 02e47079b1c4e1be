"""The small quantized models the AMX kernel probe computes (``bmoe.adapters.amx_kernel``).

Two synthetic ``qwen3moe`` models, one quantized Q4_0 everywhere and one Q8_0 (both types
llama.cpp's AMX kernel takes), whose dense matrices have the shapes its AMX buffer type
accepts (output features a multiple of 32, rows of whole blocks). Generated on first use
into bmoe's fixture folder and reused (``bmoe.adapters.cache_dirs``: a few hundred KiB).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from bmoe.adapters.cache_dirs import fixture_dir
from bmoe.adapters.file_writes import replacing
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
            # by the rule: a concurrent writer's identical file may win the rename
            with replacing(path, f"the AMX probe's {quant} model") as tmp:
                write_synthetic(tmp, attrs.evolve(PROBE_SHAPE, quant=quant), seed=_SEED, progress=False)
        out.append((quant.upper(), path))
    return out
