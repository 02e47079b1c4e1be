"""Where a GGUF file's header ends, read from its first bytes as they come.

A GGUF file is its header (magic, version, counts, every metadata key and value, every
tensor's name, shape, type and offset), padding to ``general.alignment`` (32 unless the
header says), then the tensors' data. ``header_length`` walks the header through a
``fetch(start, end)`` that returns those bytes of the file, asking for more only as the
walk needs them, in blocks that grow from ``FIRST_BLOCK`` (a tokenizer of 150k tokens
makes a header of several MiB), so what is fetched is the header and at most one block
more. The header's values themselves are read from the bytes fetched by ggml's own parser
(``bmoe.adapters.gguf_layout``), as for a local file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from bmoe.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
FIRST_BLOCK = 256 * 1024
MAX_BLOCK = 8 * 1024 * 1024
DEFAULT_ALIGNMENT = 32
# gguf_type -> the size of one value (strings and arrays are walked)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _U32 = 8, 9, 4


class HeaderCursor:
    """The header's bytes as fetched so far, and a position in them."""

    def __init__(self, fetch: Callable[[int, int], bytes], name: str, size: int | None = None) -> None:
        self._fetch = fetch
        self.name = name
        self.size = size  # the file's length where known
        self.data = bytearray()
        self.pos = 0
        self._block = FIRST_BLOCK

    def need(self, n: int) -> None:
        """Make sure ``n`` bytes from the position are fetched."""
        while self.pos + n > len(self.data):
            start = len(self.data)
            end = start + max(self._block, self.pos + n - start)
            if self.size is not None:
                end = min(end, self.size)
            got = self._fetch(start, end) if end > start else b""
            if not got:
                raise ModelLoadError(
                    f"{self.name} is truncated: its GGUF header runs past its end ({start} bytes)"
                )
            self.data += got
            self._block = min(MAX_BLOCK, self._block * 2)

    def take(self, n: int) -> bytes:
        self.need(n)
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        self.need(n)
        self.pos += n

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self._length(self.u64()))

    def _length(self, n: int) -> int:
        if n > (1 << 31):
            raise ModelLoadError(f"{self.name} has a broken GGUF header (a length of {n} at byte {self.pos})")
        return n


def _skip_value(cur: HeaderCursor, kind: int) -> None:
    if kind in _FIXED:
        cur.skip(_FIXED[kind])
    elif kind == _STRING:
        cur.skip(cur._length(cur.u64()))
    elif kind == _ARRAY:
        item, count = cur.u32(), cur._length(cur.u64())
        if item in _FIXED:
            cur.skip(_FIXED[item] * count)
        else:
            for _ in range(count):
                _skip_value(cur, item)
    else:
        raise ModelLoadError(f"{cur.name} has a broken GGUF header (value type {kind} at byte {cur.pos})")


def header_length(cur: HeaderCursor) -> int:
    """Where the tensors' data starts (the header and its padding), fetching as it walks.
    Raises ``ModelLoadError`` naming the file for one that is not GGUF, or is cut short."""
    magic = cur.take(4) if cur.size is None or cur.size >= 4 else b""
    if magic != MAGIC:
        raise ModelLoadError(f"{cur.name} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = cur.u32()
    if version not in VERSIONS:
        raise ModelLoadError(f"{cur.name} is GGUF version {version}; llama.cpp reads versions 2 and 3")
    n_tensors, n_kv = cur.u64(), cur.u64()
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cur.string()
        kind = cur.u32()
        if key == b"general.alignment" and kind == _U32:
            alignment = cur.u32()
        else:
            _skip_value(cur, kind)
    for _ in range(n_tensors):
        cur.string()
        n_dims = cur.u32()
        if n_dims > 4:
            raise ModelLoadError(f"{cur.name} has a broken GGUF header (a tensor of {n_dims} dimensions)")
        cur.skip(8 * n_dims + 4 + 8)
    if alignment <= 0:
        raise ModelLoadError(f"{cur.name} has a broken GGUF header (alignment {alignment})")
    return -(-cur.pos // alignment) * alignment
