"""A corpus of broken GGUF files, made from a good one (for test_broken_model_files.py).

``header_fields`` walks a GGUF v3 header and says where each field lies, so a case can
overwrite exactly one of them (a count, a dimension, a type, an offset).
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import attrs

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # gguf_type -> bytes
_STRING, _ARRAY = 8, 9


@attrs.frozen
class Header:
    n_tensors_at: int
    n_kv_at: int
    kv_type_at: dict[str, int]  # key -> where its type (u32) lies
    kv_string_len_at: list[int]  # where each string value's length (u64) lies
    dims_at: dict[str, list[int]]  # tensor -> where each dimension (u64) lies
    type_at: dict[str, int]  # tensor -> where its ggml type (u32) lies
    offset_at: dict[str, int]  # tensor -> where its data offset (u64) lies
    end: int  # where the tensor infos end


def header_fields(data: bytes) -> Header:
    pos = 8

    def u32() -> int:
        nonlocal pos
        pos += 4
        return int(struct.unpack_from("<I", data, pos - 4)[0])

    def u64() -> int:
        nonlocal pos
        pos += 8
        return int(struct.unpack_from("<Q", data, pos - 8)[0])

    string_lens: list[int] = []

    def string() -> str:
        nonlocal pos
        string_lens.append(pos)
        n = u64()
        pos += n
        return data[pos - n : pos].decode("utf-8", "replace")

    def value(kind: int) -> None:
        nonlocal pos
        if kind == _STRING:
            string()
        elif kind == _ARRAY:
            inner, count = u32(), u64()
            if inner == _STRING:
                for _ in range(count):
                    string()
            else:
                pos += _SCALAR[inner] * count
        else:
            pos += _SCALAR[kind]

    n_tensors_at = pos
    n_tensors = u64()
    n_kv_at = pos
    n_kv = u64()
    kv_type_at: dict[str, int] = {}
    value_lens: list[int] = []
    for _ in range(n_kv):
        key = string()
        string_lens.pop()
        kv_type_at[key] = pos
        before = len(string_lens)
        value(u32())
        value_lens += string_lens[before:]
        del string_lens[before:]
    dims_at: dict[str, list[int]] = {}
    type_at: dict[str, int] = {}
    offset_at: dict[str, int] = {}
    for _ in range(n_tensors):
        name = string()
        n_dims = u32()
        dims_at[name] = [pos + 8 * i for i in range(n_dims)]
        pos += 8 * n_dims
        type_at[name] = pos
        pos += 4
        offset_at[name] = pos
        pos += 8
    return Header(n_tensors_at, n_kv_at, kv_type_at, value_lens, dims_at, type_at, offset_at, pos)


def _put(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def single_file_cases(good: Path) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each broken variant of the single-file model ``good``."""
    data = good.read_bytes()
    h = header_fields(data)
    size = len(data)
    first = next(iter(h.offset_at))
    big = next(name for name in h.dims_at if "exps" in name)
    cuts = sorted(
        {0, 1, 3, 4, 7, 8, 15, 16, 23, 24, 40, 200, 1000, h.end // 2, h.end - 1, h.end, h.end + 1}
        | {h.end + (size - h.end) * k // 8 for k in range(1, 8)}
        | {size - 1}
    )
    for cut in cuts:
        yield f"truncated-at-{cut}", data[:cut]
    yield "empty", b""
    yield "bad-magic", b"GGUX" + data[4:]
    yield "text-file", b"this is not a model\n" * 100
    for version in (0, 1, 2, 4, 0xFFFFFFFF):
        yield f"version-{version}", _put(data, 4, "<I", version)
    for count in (0, 1, 2**31, 2**62, 2**64 - 1):
        yield f"n-tensors-{count}", _put(data, h.n_tensors_at, "<Q", count)
        yield f"n-kv-{count}", _put(data, h.n_kv_at, "<Q", count)
    yield "kv-string-length-huge", _put(data, h.kv_string_len_at[0], "<Q", 2**62)
    yield "kv-string-length-past-end", _put(data, h.kv_string_len_at[0], "<Q", size)
    yield "kv-type-invalid", _put(data, h.kv_type_at["general.architecture"], "<I", 99)
    yield "kv-type-wrong", _put(data, h.kv_type_at["general.architecture"], "<I", 4)
    arch_count = next(k for k in h.kv_type_at if k.endswith(".expert_count"))
    yield "kv-expert-count-as-string", _put(data, h.kv_type_at[arch_count], "<I", _STRING)
    yield "tensor-offset-past-end", _put(data, h.offset_at[first], "<Q", size * 4)
    yield "tensor-offset-huge", _put(data, h.offset_at[first], "<Q", 2**63)
    yield "tensor-offset-misaligned", _put(data, h.offset_at[first], "<Q", 3)
    yield "expert-offset-past-end", _put(data, h.offset_at[big], "<Q", size - 64)
    for dim in (0, 2**40, 2**63 - 1, 2**64 - 1):
        yield f"dim-{dim}", _put(data, h.dims_at[big][0], "<Q", dim)
    yield (
        "dim-doubled",
        _put(data, h.dims_at[big][-1], "<Q", 2 * int(struct.unpack_from("<Q", data, h.dims_at[big][-1])[0])),
    )
    for ggml_type in (1, 2, 8, 200, 2**32 - 1):
        yield f"type-{ggml_type}", _put(data, h.type_at[big], "<I", ggml_type)


def split_cases(shards: list[Path], other: Path, into: Path) -> Iterator[tuple[str, Path]]:
    """Broken copies of the split model ``shards`` under ``into``: (name, first shard).
    ``other``: another model's file, put in as a shard."""

    def copy(name: str, files: list[Path | bytes]) -> Path:
        folder = into / name
        folder.mkdir(parents=True)
        count = len(files)
        paths = [folder / f"model-{i + 1:05d}-of-{count:05d}.gguf" for i in range(count)]
        for path, src in zip(paths, files, strict=True):
            if isinstance(src, bytes):
                path.write_bytes(src)
            else:
                shutil.copyfile(src, path)
        return paths[0]

    first = copy("shard-missing", list(shards))
    first.with_name(first.name.replace("00001-of", "00002-of")).unlink()
    yield "shard-missing", first
    yield "shard-from-another-model", copy("shard-from-another-model", [shards[0], other, shards[2]])
    yield "shards-swapped", copy("shards-swapped", [shards[0], shards[2], shards[1]])
    yield (
        "shard-truncated",
        copy(
            "shard-truncated", [shards[0], shards[1], shards[2].read_bytes()[: shards[2].stat().st_size // 2]]
        ),
    )
    yield "shard-count-wrong", copy("shard-count-wrong", [shards[0], shards[1]])
    yield "shard-is-a-directory", _with_dir(copy("shard-is-a-directory", list(shards)))


def _with_dir(first: Path) -> Path:
    third = first.with_name(first.name.replace("00001-of", "00003-of"))
    third.unlink()
    third.mkdir()
    return first
