"""The tensor layout read by ggml's C parser equals the ``gguf`` package's reading of the
same files (every fixture, the split one included), and a bad file is a ``ModelLoadError``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from bmoe.adapters.gguf_layout import read_layout, shard_paths
from bmoe.errors import ModelLoadError
from bmoe.testing.fixtures import FIXTURES

TinyModel = Callable[[str], Path]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_c_parser_reads_what_the_gguf_package_reads(name: str, tiny_model_path: TinyModel) -> None:
    path = tiny_model_path(name)
    ours = {t.name: (t.file_index, t.offset, t.n_bytes, t.shape) for t in read_layout(path).tensors.values()}
    theirs = {}
    for index, shard in enumerate(shard_paths(path)):
        for t in gguf.GGUFReader(shard).tensors:
            theirs[t.name] = (index, int(t.data_offset), int(t.n_bytes), tuple(int(x) for x in t.shape))
    assert ours == theirs and ours


def test_a_file_that_is_not_gguf_is_a_model_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        read_layout(bad)
