"""Where each tensor of a GGUF model lies: file (shard) and byte offset.

Read with the ``gguf`` package's reader; a split model (``NAME-00001-of-0000N.gguf``) is
read shard by shard, so every tensor knows its own file.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import gguf

from bmoe.errors import ModelLoadError

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@attrs.frozen
class TensorLocation:
    name: str
    file_index: int
    offset: int  # absolute byte offset of the data in its file
    n_bytes: int
    shape: tuple[int, ...]  # ggml order: ne[0], ne[1], ...


@attrs.frozen
class ModelLayout:
    paths: tuple[Path, ...]
    sizes: tuple[int, ...]
    tensors: dict[str, TensorLocation]

    def in_file(self, index: int) -> list[TensorLocation]:
        return [t for t in self.tensors.values() if t.file_index == index]


def shard_paths(first: Path) -> list[Path]:
    """All files of a model given its (first) file."""
    match = _SPLIT.match(first.name)
    if match is None:
        return [first]
    count = int(match["count"])
    paths = [first.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ModelLoadError(f"split model is missing shard(s): {', '.join(map(str, missing))}")
    return paths


def read_layout(first: Path) -> ModelLayout:
    paths = shard_paths(Path(first))
    tensors: dict[str, TensorLocation] = {}
    for index, path in enumerate(paths):
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            tensors[t.name] = TensorLocation(
                name=t.name,
                file_index=index,
                offset=int(t.data_offset),
                n_bytes=int(t.n_bytes),
                shape=tuple(int(x) for x in t.shape),
            )
    return ModelLayout(paths=tuple(paths), sizes=tuple(p.stat().st_size for p in paths), tensors=tensors)
