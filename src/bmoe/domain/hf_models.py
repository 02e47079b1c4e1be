"""Which GGUF files of a Hugging Face repository a ``-hf`` spec names (llama.cpp's rule).

``-hf USER/REPO[:QUANT]``: the repository and, optionally, a quantization named the way
GGUF files are (``Q4_K_M``, ``q8_0``, ``UD-Q4_K_XL``). The file is the GGUF whose name holds
that quantization (case-insensitive), else, with no quantization given, ``Q4_K_M`` if the
repository has it, else its first GGUF; projector files (``mmproj``) are never the model.
A model split in shards (``...-00001-of-00003.gguf``) is all of its shards, the first one
first (the one llama.cpp opens). ``--hf-file FILE`` names the file outright.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from bmoe.errors import ConfigError

DEFAULT_QUANT = "Q4_K_M"
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@attrs.frozen
class HfSpec:
    """``repo`` (``user/name``) and the ``quant`` asked for (empty: the default rule)."""

    repo: str
    quant: str = ""

    @classmethod
    def parse(cls, spec: str) -> HfSpec:
        repo, _, quant = spec.strip().partition(":")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise ConfigError(f"-hf takes USER/REPO[:QUANT], got {spec!r}", "hf_repo")
        return cls(repo, quant.strip())


def _is_model(name: str) -> bool:
    base = name.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and "mmproj" not in base


def _shards(chosen: str, names: list[str]) -> list[str]:
    """``chosen`` and, when it is a shard, its siblings, first shard first."""
    match = _SHARD.search(chosen)
    if match is None:
        return [chosen]
    stem, total = chosen[: match.start()], match.group(2)
    siblings = [n for n in names if n.startswith(stem) and (m := _SHARD.search(n)) and m.group(2) == total]
    return sorted(siblings, key=lambda n: int(_SHARD.search(n).group(1)))  # type: ignore[union-attr]


def pick_files(spec: HfSpec, files: Iterable[str]) -> list[str]:
    """The repository files that are the model ``spec`` names: one, or every shard of it.
    Raises ``ConfigError`` naming what the repository offers when none fits."""
    names = sorted(f for f in files if _is_model(f))
    if not names:
        raise ConfigError(f"{spec.repo} holds no GGUF model file", "hf_repo")
    wanted = spec.quant or DEFAULT_QUANT
    fitting = [n for n in names if wanted.lower() in n.rsplit("/", 1)[-1].lower()]
    if not fitting and spec.quant:
        offered = ", ".join(n.rsplit("/", 1)[-1] for n in names[:12])
        raise ConfigError(f"{spec.repo} has no GGUF file for {spec.quant!r}; it has: {offered}", "hf_repo")
    return _shards((fitting or names)[0], names)


MMPROJ_PREFERENCE = ("f16", "bf16", "f32", "q8_0")  # the encoder's usual releases, best first


def pick_mmproj(files: Iterable[str]) -> str | None:
    """The repository's vision encoder (a GGUF with ``mmproj`` in its name), as llama.cpp's
    ``-hf`` fetches it beside the model: F16 before the others where several are offered;
    None where there is none."""
    names = sorted(
        f for f in files if f.lower().endswith(".gguf") and "mmproj" in f.rsplit("/", 1)[-1].lower()
    )
    for kind in MMPROJ_PREFERENCE:
        for name in names:
            if kind in name.rsplit("/", 1)[-1].lower():
                return name
    return names[0] if names else None


def _base(name: str) -> str:
    return name.rsplit("/", 1)[-1].lower()
