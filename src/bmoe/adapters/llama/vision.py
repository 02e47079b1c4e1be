"""``VisionEncoder``: a model's vision encoder (its ``--mmproj`` file) through llama.cpp's
``mtmd``: a prompt with images becomes text tokens and image rows, an image's rows become
embeddings.

mtmd only tokenizes and encodes here; the embeddings are decoded by the session's own
context (``LlamaContext.decode_embeddings``), so every MoE layer, and the streaming hook,
sees an image's batches as it sees text. The encoder runs in its own small context and
stays resident. An image is named by its decoded pixels (``picture_pixels.Pixels.digest``):
the rows' ids (``domain.media.image_rows``) are made from that name.

A conversation sends its earlier pictures again with every turn; none is decoded, resized
or encoded again while the encoder remembers it (issue 64):

- a picture's bytes seen before (their sha256) give its size and pixels' digest without
  decoding (``SEEN_PICTURES`` remembered), and every picture is tokenized as a *placeholder*
  of its size (mtmd counts its rows and positions without its pixels), so tokenizing a
  prompt costs no image work beyond hashing the bytes of the pictures not seen before;
- an image's rows and positions stay known (``HELD_IMAGES``: a placeholder chunk each);
- its embeddings, and the picture's bytes to encode it again, are kept in a byte-bounded
  keep (``domain.media.image_keep``, ``cache_bytes``: ``--image-cache-mb``): an image whose
  rows the prompt cache does not cover is encoded only when its embeddings are not kept,
  from its bytes (decoded, resized by mtmd, encoded), and the embeddings kept for the next
  turn. A prompt's own pictures are kept until it is fed (``PIN_TURNS``), whatever the
  limit.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Concatenate, Literal, ParamSpec, TypeVar

import attrs
import llama_cpp
import numpy as np
import numpy.typing as npt

from bmoe.adapters.llama.log import capture_errors, route_mtmd_log
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.picture_pixels import Pixels, decode
from bmoe.domain.chat import with_one_bos
from bmoe.domain.media import MEDIA_MARKER, Image, ImageRows, image_row_ids
from bmoe.domain.media.image_keep import DEFAULT_IMAGE_CACHE_MIB, ImageKeep
from bmoe.errors import ImageError, VisionEncoderError

MIB = 1 << 20
SEEN_PICTURES = 4096  # pictures' bytes whose size and pixels' digest are remembered
HELD_IMAGES = 1024  # images whose rows and positions are remembered (least recently used go)
PIN_TURNS = 16  # prompts tokenized whose pictures stay kept until fed (a slot's each, and more)

Kept = Literal["embeddings", "picture"]
P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[Concatenate[VisionEncoder, P], R]) -> Callable[Concatenate[VisionEncoder, P], R]:
    """One caller at a time: a prompt is counted (``/v1/responses/input_tokens``) on the
    server's thread while the worker feeds another's images, and mtmd's context and the
    encoder's tables are not for two threads at once."""

    def call(self: VisionEncoder, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    call.__doc__ = method.__doc__
    return call


@functools.cache
def _library() -> types.ModuleType | None:
    """llama-cpp-python's mtmd binding (it maps libmtmd), its log routed as llama.cpp's; None
    where llama-cpp-python was built without it. Loaded on first use, not on import: a text
    session never maps it."""
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError, FileNotFoundError):
        return None
    route_mtmd_log(mtmd_cpp.mtmd_log_set)
    return mtmd_cpp


def available() -> bool:
    """Whether this llama-cpp-python has libmtmd (vision encoders)."""
    return _library() is not None


def no_vision_encoder(images: Sequence[Image]) -> ImageError:
    """The refusal of an image by a model loaded without a vision encoder."""
    where = images[0].name if images and images[0].name else "images"
    return ImageError(
        f"{where}: this model was loaded without a vision encoder, so it cannot see images "
        "(start bmoe with --mmproj FILE, the model's projector)",
        where,
    )


@attrs.frozen
class Prompt:
    """A prompt with images: its token ids, each image a run of row ids (negative)."""

    tokens: list[int]
    images: tuple[ImageRows, ...]


@attrs.frozen
class _Seen:
    """A picture's size and pixels' digest, remembered by its bytes' sha256."""

    nx: int
    ny: int
    digest: bytes


class _Held:
    """An image's rows and mtmd's placeholder chunk of it (its positions, no pixels)."""

    def __init__(self, lib: types.ModuleType, chunk: int, rows: ImageRows) -> None:
        self._lib = lib
        self.chunk = chunk
        self.rows = rows

    def free(self) -> None:
        if self.chunk:
            self._lib.mtmd_input_chunk_free(self.chunk)
            self.chunk = 0


class VisionEncoder:
    """An mmproj loaded for ``model``; free with ``close()``.

    ``image_min_tokens`` / ``image_max_tokens``: llama.cpp's ``--image-min-tokens`` /
    ``--image-max-tokens`` (-1: the file's own), for encoders of dynamic resolution;
    ``cache_bytes``: the most the embeddings and pictures kept take (``--image-cache-mb``).
    """

    def __init__(
        self,
        model: LlamaModel,
        mmproj: Path,
        *,
        n_threads: int,
        image_min_tokens: int = -1,
        image_max_tokens: int = -1,
        cache_bytes: int = DEFAULT_IMAGE_CACHE_MIB * MIB,
    ) -> None:
        lib = _library()
        if lib is None:
            raise VisionEncoderError("this llama-cpp-python was built without libmtmd: no vision encoders")
        marker = lib.mtmd_default_marker()
        if marker is None or marker.decode() != MEDIA_MARKER:
            raise VisionEncoderError(
                f"mtmd's media marker is {marker!r}, bmoe places images with {MEDIA_MARKER!r}"
            )
        if not mmproj.is_file():
            raise VisionEncoderError(f"{mmproj}: no such file (--mmproj)")
        self.model = model
        self.mmproj = mmproj
        self._lib = lib
        self._lock = threading.RLock()
        self._seen: OrderedDict[bytes, _Seen] = OrderedDict()
        self._held: OrderedDict[tuple[int, ...], _Held] = OrderedDict()
        self._fresh: dict[bytes, Pixels] = {}  # the last prompt's new pictures, by digest: not decoded twice
        self.keep: ImageKeep[tuple[Kept, tuple[int, ...]], object] = ImageKeep(cache_bytes, PIN_TURNS)
        self.decoded = 0  # pictures decoded (to name them, or to encode them)
        self.encoded = 0  # images encoded
        params = lib.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        params.media_marker = MEDIA_MARKER.encode()
        params.image_min_tokens = image_min_tokens
        params.image_max_tokens = image_max_tokens
        with capture_errors() as errors:
            ctx = lib.mtmd_init_from_file(str(mmproj).encode(), model.ptr, params)
        if not ctx:
            why = "; ".join(line for line in errors if line) or "mtmd could not load it"
            raise VisionEncoderError(f"{mmproj.name} is not a vision encoder for this model: {why}")
        self._ctx: int | None = ctx
        if not lib.mtmd_support_vision(ctx):
            self.close()
            raise VisionEncoderError(f"{mmproj.name} holds no vision encoder (an audio projector?)")
        self.mrope: bool = bool(lib.mtmd_decode_use_mrope(ctx))
        self.n_embd: int = int(llama_cpp.llama_model_n_embd_inp(model.ptr))

    @property
    def ctx(self) -> int:
        if self._ctx is None:
            raise ValueError("the vision encoder is closed")
        return self._ctx

    @_locked
    def close(self) -> None:
        for held in self._held.values():
            held.free()
        self._held.clear()
        if self._ctx is not None:
            self._lib.mtmd_free(self._ctx)
            self._ctx = None

    # -- prompts ---------------------------------------------------------------------------

    @_locked
    def tokenize(self, text: str, images: Sequence[Image]) -> Prompt:
        """``text`` with one ``MEDIA_MARKER`` per image, as token ids (specials parsed, one
        leading BOS where the model wants it) and image rows. Raises ``ImageError`` for a
        picture that does not decode or a marker count that does not match. A new turn for
        the keep: these pictures are kept until the next one."""
        self.keep.begin_turn()
        self._fresh.clear()
        seen = [self._look(image) for image in images]
        names = ", ".join(image.name or "an image" for image in images)
        tokens, found, _ = self._tokenize(text, [(s.nx, s.ny, s.digest) for s in seen], None, names)
        for image, rows in zip(images, found, strict=True):
            self.keep.put(("picture", rows.key), image.data, len(image.data), pinned=True)
        return Prompt(with_one_bos(tokens, self.model.bos, self.model.add_bos), tuple(found))

    def _look(self, image: Image) -> _Seen:
        """The picture's size and digest: remembered by its bytes, else decoded."""
        name = hashlib.sha256(image.data).digest()
        seen = self._seen.get(name)
        if seen is None:
            pixels = self._decode(image)
            seen = _Seen(pixels.nx, pixels.ny, pixels.digest)
            self._fresh[pixels.digest] = pixels
            self._seen[name] = seen
            while len(self._seen) > SEEN_PICTURES:
                self._seen.popitem(last=False)
        self._seen.move_to_end(name)
        return seen

    def _decode(self, image: Image) -> Pixels:
        """The picture's pixels (``bmoe.adapters.picture_pixels``: mtmd's reader first,
        Pillow for the rest, EXIF orientation applied); ``ImageError`` naming it if it is not
        one."""
        self.decoded += 1
        return decode(image.data, image.name or "an image", image.name or "images", self._stb)

    def _tokenize(
        self,
        text: str,
        pictures: Sequence[tuple[int, int, bytes]],
        pixels: Pixels | None,
        names: str = "an image",
    ) -> tuple[list[int], list[ImageRows], list[npt.NDArray[np.float32]]]:
        """mtmd's tokens and rows for ``text`` placing ``pictures`` (size, digest), each a
        placeholder (no pixels), the rows held; with ``pixels`` (one picture's), its chunk
        is made of them and encoded, and the embeddings (third) kept."""
        bitmaps = [self._bitmap(nx, ny, digest, pixels) for nx, ny, digest in pictures]
        chunks = self._lib.mtmd_input_chunks_init()
        try:
            data = text.encode("utf-8")
            inp = self._lib.mtmd_input_text(
                text=data, text_len=len(data), add_special=False, parse_special=True
            )
            array = (self._lib.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            code = self._lib.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), array, len(bitmaps))
            if code == 1:
                raise ImageError(
                    f"the prompt places {text.count(MEDIA_MARKER)} images but {len(pictures)} were given",
                    "images",
                )
            if code != 0:
                raise ImageError(
                    f"the vision encoder could not prepare {names} (mtmd_tokenize: {code})", "images"
                )
            return self._read(chunks, [digest for _, _, digest in pictures], encode=pixels is not None)
        finally:
            self._lib.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                self._lib.mtmd_bitmap_free(bitmap)

    def _bitmap(self, nx: int, ny: int, digest: bytes, pixels: Pixels | None) -> int:
        """mtmd's bitmap of a picture: its ``pixels``, else a placeholder of its size."""
        buf = None if pixels is None else (ctypes.c_uint8 * len(pixels.rgb)).from_buffer_copy(pixels.rgb)
        bitmap = self._lib.mtmd_bitmap_init(nx, ny, buf)
        if not bitmap:
            raise ImageError(f"mtmd could not take a picture of {nx}x{ny} pixels", "images")
        self._lib.mtmd_bitmap_set_id(bitmap, digest.hex().encode())
        return int(bitmap)

    def _stb(self, data: bytes) -> Pixels | None:
        """mtmd's own reading of a picture (stb_image), None where it cannot read it."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = self._lib.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
        if not bitmap:
            return None
        try:
            if self._lib.mtmd_bitmap_is_audio(bitmap):
                return None
            nx, ny = self._lib.mtmd_bitmap_get_nx(bitmap), self._lib.mtmd_bitmap_get_ny(bitmap)
            size = self._lib.mtmd_bitmap_get_n_bytes(bitmap)
            return Pixels(nx, ny, ctypes.string_at(self._lib.mtmd_bitmap_get_data(bitmap), size))
        finally:
            self._lib.mtmd_bitmap_free(bitmap)

    def _read(
        self, chunks: int, digests: list[bytes], *, encode: bool
    ) -> tuple[list[int], list[ImageRows], list[npt.NDArray[np.float32]]]:
        tokens: list[int] = []
        images: list[ImageRows] = []
        encoded: list[npt.NDArray[np.float32]] = []
        for i in range(self._lib.mtmd_input_chunks_size(chunks)):
            chunk = self._lib.mtmd_input_chunks_get(chunks, i)
            kind = self._lib.mtmd_input_chunk_get_type(chunk)
            if kind == self._lib.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ptr = self._lib.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens += ptr[: n.value] if n.value else []
                continue
            if kind != self._lib.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise ImageError("only images are supported (not audio)", "images")
            n_tokens = int(self._lib.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(self._lib.mtmd_input_chunk_get_n_pos(chunk))
            rows = ImageRows(image_row_ids(digests[len(images)], n_tokens), n_pos)
            images.append(rows)
            if encode:
                encoded.append(self._encode(chunk, rows))
            self._hold(chunk, rows)
            tokens += rows.ids
        return tokens, images, encoded

    def _hold(self, chunk: int, rows: ImageRows) -> None:
        if rows.key in self._held:
            self._held.move_to_end(rows.key)
            return
        self._held[rows.key] = _Held(self._lib, self._lib.mtmd_input_chunk_get_placeholder(chunk), rows)
        while len(self._held) > HELD_IMAGES:
            _, old = self._held.popitem(last=False)
            old.free()

    def _encode(self, chunk: int, rows: ImageRows) -> npt.NDArray[np.float32]:
        code = self._lib.mtmd_encode_chunk(self.ctx, chunk)
        if code != 0:
            raise ImageError(f"the vision encoder failed on an image (mtmd_encode_chunk: {code})", "images")
        n = rows.n_tokens * self.n_embd
        out = self._lib.mtmd_get_output_embd(self.ctx)
        embeddings = np.ctypeslib.as_array(out, shape=(n,)).copy().reshape(rows.n_tokens, self.n_embd)
        embeddings.flags.writeable = False
        self.encoded += 1
        self.keep.put(("embeddings", rows.key), embeddings, embeddings.nbytes)
        return embeddings

    # -- images ----------------------------------------------------------------------------

    @_locked
    def rows_at(self, tokens: Sequence[int], start: int) -> ImageRows:
        """The image whose rows begin at ``tokens[start]`` (the longest the encoder holds);
        ``ImageError`` where it holds none (a prompt must be tokenized by this encoder)."""
        found: ImageRows | None = None
        first = tokens[start]
        for held in self._held.values():
            rows = held.rows
            if (
                rows.ids[0] == first
                and (found is None or rows.n_tokens > found.n_tokens)
                and tuple(tokens[start : start + rows.n_tokens]) == rows.ids
            ):
                found = rows
        if found is None:
            raise ImageError("an image the prompt places is no longer held: send it again", "images")
        return found

    @_locked
    def embeddings(self, key: tuple[int, ...]) -> npt.NDArray[np.float32]:
        """The image's rows as the text model's input, ``[n_tokens, n_embd]``: kept, else
        encoded from the picture kept (and kept for next time, room permitting)."""
        held = self._held_at(key)
        kept = self.keep.get(("embeddings", key))
        if kept is not None:
            return kept  # type: ignore[return-value]
        picture = self.keep.get(("picture", key))
        if not isinstance(picture, bytes):
            raise ImageError("an image the prompt places is no longer held: send it again", "images")
        name = hashlib.sha256(picture).digest()
        seen = self._seen.get(name)
        pixels = self._fresh.pop(seen.digest, None) if seen is not None else None
        pixels = pixels or self._decode(Image(picture))
        _, rows, made = self._tokenize(MEDIA_MARKER, [(pixels.nx, pixels.ny, pixels.digest)], pixels)
        if [r.key for r in rows] != [held.rows.key]:  # the bytes kept name another image: never
            raise ImageError("the picture kept is not the image the prompt places: send it again", "images")
        return made[0]

    @_locked
    def positions(self, key: tuple[int, ...], pos_0: int) -> npt.NDArray[np.int32]:
        """The image's rows' positions from ``pos_0``: ``[1, n]``, or M-RoPE's ``[4, n]``
        (sections t, y, x, z: the order llama.cpp's mtmd helper lays them in)."""
        held = self._held_at(key)
        n = held.rows.n_tokens
        if not self.mrope:
            return (pos_0 + np.arange(n, dtype=np.int32)).reshape(1, n)
        image = self._lib.mtmd_input_chunk_get_tokens_image(held.chunk)
        out = np.empty((4, n), dtype=np.int32)
        for i in range(n):
            p = self._lib.mtmd_image_tokens_get_decoder_pos(image, pos_0, i)
            out[:, i] = (p.t, p.y, p.x, p.z)
        return out

    @_locked
    def non_causal(self, key: tuple[int, ...]) -> bool:
        """Whether the image's rows are decoded attending both ways (mtmd's say)."""
        return bool(self._lib.mtmd_decode_use_non_causal(self.ctx, self._held_at(key).chunk))

    def _held_at(self, key: tuple[int, ...]) -> _Held:
        held = self._held.get(key)
        if held is None:
            raise ImageError("an image the prompt places is no longer held: send it again", "images")
        self._held.move_to_end(key)
        return held
