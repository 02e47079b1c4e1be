"""``VisionEncoder``: a model's vision encoder (its ``--mmproj`` file) through llama.cpp's
``mtmd``: a prompt with images becomes text tokens and image rows, an image's rows become
embeddings.

mtmd only tokenizes and encodes here; the embeddings are decoded by the session's own
context (``LlamaContext.decode_embeddings``), so every MoE layer, and the streaming hook,
sees an image's batches as it sees text. The encoder runs in its own small context and
stays resident. An image is named by its decoded pixels (sha256 of its size and RGB
bytes): the rows' ids (``domain.media.image_rows``) and the encoder's output are kept by
that name, so the same picture is encoded once while the session holds it.
"""

from __future__ import annotations

import ctypes
import functools
import types
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import attrs
import llama_cpp
import numpy as np
import numpy.typing as npt

from bmoe.adapters.llama.log import capture_errors, route_mtmd_log
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.picture_pixels import Pixels, decode
from bmoe.domain.chat import with_one_bos
from bmoe.domain.media import MEDIA_MARKER, Image, ImageRows, image_row_ids
from bmoe.errors import ImageError, VisionEncoderError

KEPT_IMAGES = 16  # images whose rows and embeddings stay ready (least recently used go)


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


class _Kept:
    """An image chunk mtmd made, and its embeddings once encoded."""

    def __init__(self, lib: types.ModuleType, chunk: int, rows: ImageRows) -> None:
        self._lib = lib
        self.chunk = chunk
        self.rows = rows
        self.embeddings: npt.NDArray[np.float32] | None = None

    def free(self) -> None:
        if self.chunk:
            self._lib.mtmd_input_chunk_free(self.chunk)
            self.chunk = 0


class VisionEncoder:
    """An mmproj loaded for ``model``; free with ``close()``.

    ``image_min_tokens`` / ``image_max_tokens``: llama.cpp's ``--image-min-tokens`` /
    ``--image-max-tokens`` (-1: the file's own), for encoders of dynamic resolution.
    """

    def __init__(
        self,
        model: LlamaModel,
        mmproj: Path,
        *,
        n_threads: int,
        image_min_tokens: int = -1,
        image_max_tokens: int = -1,
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
        self._kept: OrderedDict[tuple[int, ...], _Kept] = OrderedDict()
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

    def close(self) -> None:
        for kept in self._kept.values():
            kept.free()
        self._kept.clear()
        if self._ctx is not None:
            self._lib.mtmd_free(self._ctx)
            self._ctx = None

    # -- prompts ---------------------------------------------------------------------------

    def tokenize(self, text: str, images: Sequence[Image]) -> Prompt:
        """``text`` with one ``MEDIA_MARKER`` per image, as token ids (specials parsed, one
        leading BOS where the model wants it) and image rows. Raises ``ImageError`` for a
        picture that does not decode or a marker count that does not match."""
        bitmaps = [self._bitmap(image) for image in images]
        chunks = self._lib.mtmd_input_chunks_init()
        try:
            data = text.encode("utf-8")
            inp = self._lib.mtmd_input_text(
                text=data, text_len=len(data), add_special=False, parse_special=True
            )
            array = (self._lib.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*[b for b, _ in bitmaps])
            code = self._lib.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), array, len(bitmaps))
            if code == 1:
                raise ImageError(
                    f"the prompt places {text.count(MEDIA_MARKER)} images but {len(images)} were given",
                    "images",
                )
            if code != 0:
                names = ", ".join(image.name or "an image" for image in images)
                raise ImageError(
                    f"the vision encoder could not prepare {names} (mtmd_tokenize: {code})", "images"
                )
            return self._read(chunks, [digest for _, digest in bitmaps])
        finally:
            self._lib.mtmd_input_chunks_free(chunks)
            for bitmap, _ in bitmaps:
                self._lib.mtmd_bitmap_free(bitmap)

    def _bitmap(self, image: Image) -> tuple[int, bytes]:
        """A decoded picture (``bmoe.adapters.picture_pixels``: mtmd's reader first, Pillow
        for the rest, EXIF orientation applied) and its pixels' digest; ``ImageError`` naming
        it if it is not one."""
        pixels = decode(image.data, image.name or "an image", image.name or "images", self._stb)
        buf = (ctypes.c_uint8 * len(pixels.rgb)).from_buffer_copy(pixels.rgb)
        bitmap = self._lib.mtmd_bitmap_init(pixels.nx, pixels.ny, buf)
        if not bitmap:
            raise ImageError(
                f"mtmd could not hold {image.name or 'an image'}'s pixels", image.name or "images"
            )
        self._lib.mtmd_bitmap_set_id(bitmap, pixels.digest.hex().encode())
        return bitmap, pixels.digest

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

    def _read(self, chunks: int, digests: list[bytes]) -> Prompt:
        tokens: list[int] = []
        images: list[ImageRows] = []
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
            self._keep(chunk, rows)
            tokens += rows.ids
        return Prompt(with_one_bos(tokens, self.model.bos, self.model.add_bos), tuple(images))

    def _keep(self, chunk: int, rows: ImageRows) -> None:
        if rows.key in self._kept:
            self._kept.move_to_end(rows.key)
            return
        self._kept[rows.key] = _Kept(self._lib, self._lib.mtmd_input_chunk_copy(chunk), rows)
        while len(self._kept) > KEPT_IMAGES:
            _, old = self._kept.popitem(last=False)
            old.free()

    # -- images ----------------------------------------------------------------------------

    def rows_at(self, tokens: Sequence[int], start: int) -> ImageRows:
        """The image whose rows begin at ``tokens[start]`` (the longest the encoder holds);
        ``ImageError`` where it holds none (a prompt must be tokenized by this encoder)."""
        found: ImageRows | None = None
        for kept in self._kept.values():
            rows = kept.rows
            if tuple(tokens[start : start + rows.n_tokens]) == rows.ids and (
                found is None or rows.n_tokens > found.n_tokens
            ):
                found = rows
        if found is None:
            raise ImageError("an image the prompt places is no longer held: send it again", "images")
        return found

    def embeddings(self, key: tuple[int, ...]) -> npt.NDArray[np.float32]:
        """The image's rows as the text model's input, ``[n_tokens, n_embd]`` (encoded on
        first use, then kept with the image)."""
        kept = self._held(key)
        if kept.embeddings is None:
            code = self._lib.mtmd_encode_chunk(self.ctx, kept.chunk)
            if code != 0:
                raise ImageError(
                    f"the vision encoder failed on an image (mtmd_encode_chunk: {code})", "images"
                )
            n = kept.rows.n_tokens * self.n_embd
            out = self._lib.mtmd_get_output_embd(self.ctx)
            kept.embeddings = (
                np.ctypeslib.as_array(out, shape=(n,)).copy().reshape(kept.rows.n_tokens, self.n_embd)
            )
        self._kept.move_to_end(key)
        return kept.embeddings

    def positions(self, key: tuple[int, ...], pos_0: int) -> npt.NDArray[np.int32]:
        """The image's rows' positions from ``pos_0``: ``[1, n]``, or M-RoPE's ``[4, n]``
        (sections t, y, x, z: the order llama.cpp's mtmd helper lays them in)."""
        kept = self._held(key)
        n = kept.rows.n_tokens
        if not self.mrope:
            return (pos_0 + np.arange(n, dtype=np.int32)).reshape(1, n)
        image = self._lib.mtmd_input_chunk_get_tokens_image(kept.chunk)
        out = np.empty((4, n), dtype=np.int32)
        for i in range(n):
            p = self._lib.mtmd_image_tokens_get_decoder_pos(image, pos_0, i)
            out[:, i] = (p.t, p.y, p.x, p.z)
        return out

    def non_causal(self, key: tuple[int, ...]) -> bool:
        """Whether the image's rows are decoded attending both ways (mtmd's say)."""
        return bool(self._lib.mtmd_decode_use_non_causal(self.ctx, self._held(key).chunk))

    def _held(self, key: tuple[int, ...]) -> _Kept:
        kept = self._kept.get(key)
        if kept is None:
            raise ImageError("an image the prompt places is no longer held: send it again", "images")
        return kept
