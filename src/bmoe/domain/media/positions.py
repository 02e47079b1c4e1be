"""Where a sequence's images sit: the position of each index of the KV.

With 1-D positions an image's rows take one position each and the index of a token is its
position. With M-RoPE (Qwen-VL) an image of ``n_tokens`` rows takes ``n_pos`` positions
(the larger side of its grid), so every token after it stands ``n_tokens - n_pos`` before
its index; the KV still holds one cell per row. The ledger says, for a sequence the
context holds, where each image began and what it moved, so the session can feed, cut
and restore by index as it does for text.

A cut inside an image cannot keep part of it (its rows share their first position): such
a cut is refused and the caller starts again from the prefix's beginning.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import attrs

from bmoe.domain.media.image_rows import ImageRows, is_image_row

_RECORD = struct.Struct("<iii")  # start, n_tokens, n_pos


@attrs.frozen
class HeldImage:
    """An image the sequence holds: its first row's index, its rows, its positions."""

    start: int
    n_tokens: int
    n_pos: int

    @property
    def end(self) -> int:
        """The index after its last row."""
        return self.start + self.n_tokens


@attrs.define
class PositionLedger:
    """The images of one sequence, in order (a mutable record the backend keeps in step
    with its memory)."""

    images: list[HeldImage] = attrs.Factory(list)

    def position(self, index: int) -> int:
        """The position of the token at ``index`` (an image's first row: the image's)."""
        shift = sum(im.n_tokens - im.n_pos for im in self.images if im.end <= index)
        return index - shift

    def indexed(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` fed after what the sequence holds take their indices as
        positions: no image held, none among them (text's plain path)."""
        return not self.images and not any(is_image_row(t) for t in tokens)

    def splits_image(self, index: int) -> bool:
        """Whether ``index`` falls between two rows of one image."""
        return any(im.start < index < im.end for im in self.images)

    def add(self, start: int, rows: ImageRows) -> int:
        """Record ``rows`` fed from ``start`` on (after every image held); its first
        position."""
        if self.images and start < self.images[-1].end:
            raise ValueError(f"an image at {start} overlaps the one held up to {self.images[-1].end}")
        pos_0 = self.position(start)
        self.images.append(HeldImage(start, rows.n_tokens, rows.n_pos))
        return pos_0

    def cut(self, keep: int) -> int | None:
        """Forget every index from ``keep`` on; the position the memory must drop from, or
        None (nothing changed) where ``keep`` splits an image."""
        if self.splits_image(keep):
            return None
        pos = self.position(keep)
        self.images = [im for im in self.images if im.end <= keep]
        return pos

    def clear(self) -> None:
        self.images = []

    def to_bytes(self) -> bytes:
        return b"".join(_RECORD.pack(im.start, im.n_tokens, im.n_pos) for im in self.images)

    @classmethod
    def from_bytes(cls, data: bytes) -> PositionLedger:
        if len(data) % _RECORD.size:
            raise ValueError("a ledger is whole records")
        return cls([HeldImage(*_RECORD.unpack_from(data, o)) for o in range(0, len(data), _RECORD.size)])
