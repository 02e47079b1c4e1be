"""One module per llama.cpp architecture: its hyper-parameter keys and its tensors.

Each module exposes ``ARCH`` (llama.cpp's architecture string),
``add_hparams(writer, spec)`` and ``tensors(spec, init, n_vocab, muted_ids)``:
the :class:`ArchWriter` protocol that :func:`bmoe.tinymodel.writer.write_model`
takes. Here live ``qwen3moe`` (the default model's) and ``common`` (what
architectures share); the test fixtures add theirs in
:mod:`bmoe.testing.fixtures.archs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gguf import GGUFWriter

from bmoe.tinymodel.archs.common import Tensor
from bmoe.tinymodel.spec import FixtureSpec
from bmoe.tinymodel.weights import WeightInit


class ArchWriter(Protocol):
    """What the writer needs from an architecture module."""

    ARCH: str

    def add_hparams(self, writer: GGUFWriter, spec: FixtureSpec) -> None:
        """Write the ``ARCH.*`` hyper-parameter keys."""

    def tensors(
        self, spec: FixtureSpec, init: WeightInit, n_vocab: int, muted_ids: Sequence[int]
    ) -> list[Tensor]:
        """Every tensor, named and shaped as llama.cpp loads them."""
