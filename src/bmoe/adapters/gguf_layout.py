"""Where each tensor of a GGUF model lies: file (shard) and byte offset.

Read with ggml's own GGUF parser (``gguf_init_from_file`` in the ``libggml-base`` that
llama-cpp-python ships, through ctypes, without allocating tensor data): it parses the
metadata in C, so a 262k-token vocabulary costs milliseconds, where the ``gguf`` package's
Python reader took seconds. A split model (``NAME-00001-of-0000N.gguf``) is read shard by
shard, so every tensor knows its own file.
"""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path

import attrs
import llama_cpp

from bmoe.errors import ModelLoadError

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@attrs.frozen
class TensorLocation:
    name: str
    file_index: int
    offset: int  # absolute byte offset of the data in its file
    n_bytes: int
    shape: tuple[int, ...]  # ggml order: ne[0], ne[1], ...
    ggml_type: int = -1  # ggml's type id (0 = F32); -1 when not read


@attrs.frozen
class ModelLayout:
    paths: tuple[Path, ...]
    sizes: tuple[int, ...]
    tensors: dict[str, TensorLocation]

    def in_file(self, index: int) -> list[TensorLocation]:
        return [t for t in self.tensors.values() if t.file_index == index]

    def tensor_at(self, index: int, offset: int) -> str:
        """The name of the tensor whose data holds byte ``offset`` of file ``index`` ("" for none)."""
        for t in self.tensors.values():
            if t.file_index == index and t.offset <= offset < t.offset + t.n_bytes:
                return t.name
        return ""


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


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]  # struct gguf_init_params


@functools.cache
def _libggml_base() -> ctypes.CDLL:
    """ggml's base library as llama-cpp-python ships it (already loaded by ``libllama``)."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _InitParams]
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    lib.gguf_free.restype = None
    lib.gguf_get_data_offset.argtypes = [ctypes.c_void_p]
    lib.gguf_get_data_offset.restype = ctypes.c_size_t
    lib.gguf_get_n_tensors.argtypes = [ctypes.c_void_p]
    lib.gguf_get_n_tensors.restype = ctypes.c_int64
    lib.gguf_get_tensor_name.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_name.restype = ctypes.c_char_p
    lib.gguf_get_tensor_offset.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_offset.restype = ctypes.c_size_t
    lib.gguf_get_tensor_size.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_size.restype = ctypes.c_size_t
    lib.gguf_get_tensor_ne.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_ne.restype = ctypes.POINTER(ctypes.c_int64)
    lib.gguf_get_tensor_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_tensor_type.restype = ctypes.c_int
    lib.gguf_find_key.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gguf_find_key.restype = ctypes.c_int64
    lib.gguf_get_kv_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_kv_type.restype = ctypes.c_int
    for name, ctype in _INT_GETTERS.values():
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_int64]
        getattr(lib, name).restype = ctype
    lib.gguf_get_val_str.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_val_str.restype = ctypes.c_char_p
    lib.gguf_get_val_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_val_f32.restype = ctypes.c_float
    lib.gguf_get_val_f64.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_get_val_f64.restype = ctypes.c_double
    lib.gguf_find_tensor.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gguf_find_tensor.restype = ctypes.c_int64
    return lib


# gguf_type -> the getter of that integer type (gguf.h)
_INT_GETTERS = {
    0: ("gguf_get_val_u8", ctypes.c_uint8),
    1: ("gguf_get_val_i8", ctypes.c_int8),
    2: ("gguf_get_val_u16", ctypes.c_uint16),
    3: ("gguf_get_val_i16", ctypes.c_int16),
    4: ("gguf_get_val_u32", ctypes.c_uint32),
    5: ("gguf_get_val_i32", ctypes.c_int32),
    10: ("gguf_get_val_u64", ctypes.c_uint64),
    11: ("gguf_get_val_i64", ctypes.c_int64),
}
_GGUF_TYPE_STRING = 8


def read_header_values(path: Path, keys: list[str]) -> dict[str, int | str]:
    """The integer or string metadata ``keys`` of a GGUF file's header (absent keys and other
    types are left out), without loading the model. Raises ``ModelLoadError``."""
    lib = _libggml_base()
    ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
    if not ctx:
        raise ModelLoadError(f"not a readable GGUF file: {path}")
    out: dict[str, int | str] = {}
    try:
        for key in keys:
            kid = int(lib.gguf_find_key(ctx, key.encode()))
            if kid < 0:
                continue
            kind = int(lib.gguf_get_kv_type(ctx, kid))
            if kind in _INT_GETTERS:
                out[key] = int(getattr(lib, _INT_GETTERS[kind][0])(ctx, kid))
            elif kind == _GGUF_TYPE_STRING:
                out[key] = lib.gguf_get_val_str(ctx, kid).decode("utf-8", errors="replace")
    finally:
        lib.gguf_free(ctx)
    return out


def _trim_shape(ne: list[int]) -> tuple[int, ...]:
    """ggml's 4 dims without the trailing 1s (at least one dim)."""
    while len(ne) > 1 and ne[-1] == 1:
        ne = ne[:-1]
    return tuple(ne)


def _read_file(lib: ctypes.CDLL, path: Path, index: int, into: dict[str, TensorLocation]) -> None:
    ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
    if not ctx:
        raise ModelLoadError(f"not a readable GGUF file: {path}")
    try:
        base = int(lib.gguf_get_data_offset(ctx))
        for i in range(int(lib.gguf_get_n_tensors(ctx))):
            name = lib.gguf_get_tensor_name(ctx, i).decode("utf-8", errors="replace")
            ne = lib.gguf_get_tensor_ne(ctx, i)
            into[name] = TensorLocation(
                name=name,
                file_index=index,
                offset=base + int(lib.gguf_get_tensor_offset(ctx, i)),
                n_bytes=int(lib.gguf_get_tensor_size(ctx, i)),
                shape=_trim_shape([int(ne[d]) for d in range(4)]),
                ggml_type=int(lib.gguf_get_tensor_type(ctx, i)),
            )
    finally:
        lib.gguf_free(ctx)


def read_layout(first: Path) -> ModelLayout:
    """Every tensor's file, offset, size and shape. Raises ``ModelLoadError``."""
    paths = shard_paths(Path(first))
    lib = _libggml_base()
    tensors: dict[str, TensorLocation] = {}
    for index, path in enumerate(paths):
        _read_file(lib, path, index, tensors)
    return ModelLayout(paths=tuple(paths), sizes=tuple(p.stat().st_size for p in paths), tensors=tensors)


_GGUF_MAGIC = b"GGUF"
_GGUF_VERSIONS = (2, 3)  # what ggml's parser reads


def validate_model_files(first: Path) -> None:
    """Check a model's file(s) before llama.cpp sees them, so a broken one is named in one
    clear ``ModelLoadError``: the path is a file that can be read, starts with the GGUF magic
    and a version ggml reads, has a header ggml's own parser accepts (counts, strings, types
    and dimensions in range), and every tensor's data lies inside its file. A split model
    has every shard, and each shard says it is the shard its name says (``split.no``,
    ``split.count``): a shard of another model or another split is refused.

    Cheap: the headers only (milliseconds), no tensor data is read."""
    first = Path(first)
    _check_file(first)
    paths = shard_paths(first)
    lib = _libggml_base()
    for index, path in enumerate(paths):
        _check_file(path)
        _check_magic(path)
        ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
        if not ctx:
            raise ModelLoadError(
                f"{path} has a broken GGUF header (truncated, or a count, string, type or "
                "dimension out of range)"
            )
        try:
            _check_tensors_inside(lib, ctx, path)
        finally:
            lib.gguf_free(ctx)
        _check_split_keys(path, index, len(paths))


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not a model file")
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a regular file")


def _check_magic(path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    if len(head) < 8:
        raise ModelLoadError(f"{path} is not a GGUF file ({len(head)} bytes long)")
    if head[:4] != _GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')")
    version = int.from_bytes(head[4:8], "little")
    if version not in _GGUF_VERSIONS:
        raise ModelLoadError(f"{path} is GGUF version {version}; llama.cpp reads versions 2 and 3")


def _check_tensors_inside(lib: ctypes.CDLL, ctx: int, path: Path) -> None:
    size = path.stat().st_size
    base = int(lib.gguf_get_data_offset(ctx))
    for i in range(int(lib.gguf_get_n_tensors(ctx))):
        start = base + int(lib.gguf_get_tensor_offset(ctx, i))
        end = start + int(lib.gguf_get_tensor_size(ctx, i))
        if end > size:
            name = lib.gguf_get_tensor_name(ctx, i).decode("utf-8", errors="replace")
            raise ModelLoadError(
                f"{path} is truncated or corrupt: tensor {name}'s data (bytes {start}..{end}) "
                f"lies past the end of the file ({size} bytes)"
            )


def _check_split_keys(path: Path, index: int, count: int) -> None:
    values = read_header_values(path, ["split.no", "split.count"])
    no, of = values.get("split.no"), values.get("split.count")
    if count == 1:
        if isinstance(of, int) and of > 1:
            raise ModelLoadError(
                f"{path} is shard {int(no or 0) + 1} of a model split in {of} files, but its name is "
                "not NAME-0000K-of-0000N.gguf: open the first shard by its split name"
            )
        return
    if no is None or of is None:
        raise ModelLoadError(
            f"{path} is not a shard of a split model (it has no split.no/split.count): a file of "
            f"another model in the place of shard {index + 1} of {count}"
        )
    if (no, of) != (index, count):
        raise ModelLoadError(
            f"{path} says it is shard {int(no) + 1} of {of}, but its name says shard {index + 1} of "
            f"{count}: a shard of another split, or shards renamed"
        )
