"""How an image's embedding rows stand in a token sequence.

A session's prompt is a list of token ids; an image in it is a run of ``n_tokens`` ids
that no vocabulary holds (negative ones), one per embedding row, made from the image's
pixels. Two prompts with the same picture at the same place are then the same ids, so the
KV prefix reuse, the prompt cache (in memory and on disk, which keep ids as int32) and
the context checks work on images as on text, each row counting one cell of the KV.

Row ``r``'s id carries 30 bits of the pixels' sha256, chunk ``r mod 8``: an image of 8
rows or more is told apart by 240 bits of its digest (a smaller one by ``30 n`` bits).
"""

from __future__ import annotations

import attrs

ROW_BITS = 30
DIGEST_CHUNKS = 8
KEY_ROWS = DIGEST_CHUNKS  # the leading rows that name an image (with its row count)


def image_row_ids(pixel_digest: bytes, n_tokens: int) -> tuple[int, ...]:
    """The ids of an image's ``n_tokens`` rows, from its pixels' sha256 (32 bytes)."""
    if len(pixel_digest) < 4 * DIGEST_CHUNKS:
        raise ValueError("a sha256 digest (32 bytes) names an image's rows")
    if n_tokens < 1:
        raise ValueError(f"an image has at least one row, not {n_tokens}")
    mask = (1 << ROW_BITS) - 1
    chunks = [int.from_bytes(pixel_digest[4 * k : 4 * k + 4], "little") & mask for k in range(DIGEST_CHUNKS)]
    return tuple(-1 - chunks[r % DIGEST_CHUNKS] for r in range(n_tokens))


def is_image_row(token: int) -> bool:
    """True for an image row's id (no vocabulary's token)."""
    return token < 0


@attrs.frozen
class ImageRows:
    """An image as the decoder takes it: its rows' ids and how far it moves the position.

    ``n_pos``: positions the image takes (its row count with 1-D positions; with M-RoPE
    the larger side of its grid, mtmd's ``n_pos``), so the text after it starts there.
    """

    ids: tuple[int, ...]
    n_pos: int

    def __attrs_post_init__(self) -> None:
        if not self.ids or not all(is_image_row(t) for t in self.ids):
            raise ValueError("an image's rows are negative ids")
        if not 1 <= self.n_pos <= len(self.ids):
            raise ValueError(f"an image of {len(self.ids)} rows cannot take {self.n_pos} positions")

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    @property
    def key(self) -> tuple[int, ...]:
        """What names the image among the rows of a sequence: its leading ids and its size."""
        return (*self.ids[:KEY_ROWS], len(self.ids))


def key_at(tokens: list[int] | tuple[int, ...], start: int, n_tokens: int) -> tuple[int, ...]:
    """The key of the image whose ``n_tokens`` rows begin at ``tokens[start]``."""
    return (*tokens[start : start + min(KEY_ROWS, n_tokens)], n_tokens)
