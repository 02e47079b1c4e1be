"""The bench model: the synthetic Qwen3-30B-like ``qwen3moe`` at a requested size, cached.

The shape is the generator's default (2048 hidden, 768 expert width, 128 experts, top-8,
Q4_0: about 0.35 GB per layer); the size sets the number of layers, so a token reads the
same per layer whatever the size. Files live in ``$BMOE_BENCH_DIR`` (else ``bench/`` under
bmoe's cache root: :mod:`bmoe.adapters.cache_dirs`), named by their shape, seed and
generator version; a model is written to a temporary name and renamed into place, so an
interrupted run leaves no half-written model behind.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from bmoe.adapters.cache_dirs import bench_dir
from bmoe.adapters.file_writes import replacing
from bmoe.tinymodel.spec import GENERATOR_VERSION
from bmoe.tinymodel.synthetic import SyntheticShape, plan_tensors, write_synthetic

GB = 1e9


def file_bytes(shape: SyntheticShape, seed: int = 0) -> int:
    """Tensor bytes of the model (the file adds a header of a few MB and alignment)."""
    return sum(t.n_bytes for t in plan_tensors(shape, seed))


def shape_for_size(size_gb: float, base: SyntheticShape | None = None) -> SyntheticShape:
    """``base`` (the generator's default shape) with as many layers as come closest to
    ``size_gb`` GB (at least one)."""
    if size_gb <= 0:
        raise ValueError(f"the model size must be > 0 GB, not {size_gb}")
    base = base or SyntheticShape()
    one = file_bytes(attrs.evolve(base, n_layer=1))
    per_layer = file_bytes(attrs.evolve(base, n_layer=2)) - one
    fixed = one - per_layer
    n_layer = max(1, round((size_gb * GB - fixed) / per_layer))
    return attrs.evolve(base, n_layer=n_layer)


def model_name(shape: SyntheticShape, seed: int) -> str:
    return (
        f"bench-{shape.quant}-L{shape.n_layer}-E{shape.n_embd}-F{shape.n_ff_exp}-X{shape.n_expert}"
        f"-K{shape.n_expert_used}-H{shape.heads}x{shape.kv_heads}x{shape.head_dim}-seed{seed}"
        f"-v{GENERATOR_VERSION}.gguf"
    )


def cached_bench_model(shape: SyntheticShape, seed: int = 0, *, root: Path | None = None) -> Path:
    """The model's path, written first if it is not in the cache yet."""
    folder = root or bench_dir()
    final = folder / model_name(shape, seed)
    if final.is_file():
        return final
    with replacing(final, f"the bench model {final.name}") as tmp:
        write_synthetic(tmp, shape, seed)
    return final


def expert_bytes(path: Path) -> int:
    """Bytes of the routed experts' tensors (``*_exps``) of any GGUF model, from its header."""
    from bmoe.adapters.gguf_layout import read_layout

    return sum(t.n_bytes for t in read_layout(path).tensors.values() if "_exps" in t.name)


def expert_read_bytes(path: Path) -> int:
    """One read of a lane: the largest expert's projection slice (``*_exps`` bytes over its
    experts), rounded up to a page as ``O_DIRECT`` reads it."""
    from bmoe.adapters.gguf_layout import read_layout

    slices = [t.n_bytes // t.shape[2] for t in read_layout(path).tensors.values() if "_exps" in t.name]
    largest = max(slices, default=2 * 1024 * 1024)
    return -(-largest // 4096) * 4096


def written_store(path: Path) -> Path | None:
    """The expert store ``--expert-store auto`` would read for the model at ``path`` (None
    where ``python -m bmoe.store`` wrote none): the file a store configuration's probe reads."""
    from bmoe.adapters import expert_store_file
    from bmoe.adapters.gguf_layout import shard_paths
    from bmoe.adapters.usage_profile_file import model_key

    return expert_store_file.written_store(model_key(shard_paths(path)))


def tokenize(path: Path, text: str) -> list[int]:
    """``text`` as the model's tokenizer splits it (no BOS, specials not parsed): the
    sequence every configuration is fed. Stock llama-cpp-python's tokenizer, vocabulary only."""
    import llama_cpp
    from llama_cpp import _internals

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = _internals.LlamaModel(path_model=str(path), params=params, verbose=False)
    try:
        return list(model.tokenize(text.encode("utf-8"), add_bos=False, special=False))
    finally:
        model.close()  # type: ignore[no-untyped-call]
