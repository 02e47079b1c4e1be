"""A picture's bytes as the RGB pixels a vision encoder reads, as clients send pictures.

mtmd reads pictures with stb_image (PNG, JPEG, BMP, GIF: an animated GIF's first frame),
and llama.cpp's own server gives a model those pixels: they are read so here first, so that
the same picture is the same pixels, and the same answer, as llama.cpp's. What stb_image
cannot read (WebP, animated or not, AVIF, TIFF, the rare JPEG it refuses) is read with
Pillow (``bmoe[vision]``), its first frame, in one of ``PILLOW_FORMATS`` only (never a
format whose reader runs a program, as EPS's does). Either way the picture is then turned as
its EXIF orientation says (a phone's photo taken sideways stands up), read by Pillow from
the header alone; without Pillow, orientation is not applied (docs/models.md, "Images").

A picture's identity is its pixels as decoded here: ``Pixels.digest`` (sha256 of its size
and RGB bytes) names its rows (``domain.media.image_rows``), so one picture sent as PNG or
as lossless WebP is one picture, and a rotated JPEG is its upright pixels.
"""

from __future__ import annotations

import functools
import hashlib
import io
import types
import warnings
from collections.abc import Callable

import attrs

from bmoe.errors import ImageError

PILLOW_FORMATS = ("WEBP", "AVIF", "TIFF", "PNG", "JPEG", "GIF", "BMP")
MAX_PIXELS = 64 * 1024 * 1024  # a larger picture is refused before it is decoded (Pillow's side)
EXTRA = "pip install 'bmoe[vision]'"
ORIENTATION = 0x0112  # EXIF's Orientation tag


@attrs.frozen
class Pixels:
    """A decoded picture: ``nx`` by ``ny`` pixels, ``rgb`` their bytes (RGBRGB..., rows top
    down)."""

    nx: int
    ny: int
    rgb: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")

    def __attrs_post_init__(self) -> None:
        if self.nx < 1 or self.ny < 1 or len(self.rgb) != self.nx * self.ny * 3:
            raise ValueError(
                f"{self.nx}x{self.ny} RGB pixels take {self.nx * self.ny * 3} bytes, not {len(self.rgb)}"
            )

    @functools.cached_property
    def digest(self) -> bytes:
        """The picture's name: sha256 of ``"{nx}x{ny}:"`` and its RGB bytes."""
        return hashlib.sha256(f"{self.nx}x{self.ny}:".encode() + self.rgb).digest()


StbReader = Callable[[bytes], Pixels | None]
"""mtmd's own reader (stb_image): a picture's pixels, None where it cannot read it."""


@functools.cache
def pillow() -> types.ModuleType | None:
    """``PIL.Image``, None where Pillow is not installed."""
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def decode(data: bytes, name: str, param: str, stb: StbReader) -> Pixels:
    """``data``'s pixels, upright (see the module's docstring); ``ImageError`` naming the
    picture (``name``, the request's field ``param``) when it is none that can be read, or
    needs Pillow and it is missing."""
    pixels = stb(data)
    image = pillow()
    if pixels is None:
        if image is None:
            raise ImageError(
                f"{name} is not a picture mtmd can read (PNG, JPEG, BMP, GIF); WebP and other "
                f"formats are read with Pillow: {EXTRA}",
                param,
            )
        return _pillow_pixels(image, data, name, param)
    if image is None:
        return pixels
    return oriented(pixels, orientation(image, data))


def orientation(image: types.ModuleType, data: bytes) -> int:
    """The EXIF (or XMP) orientation ``data`` declares, 1 (as stored) where it declares none
    or cannot be read; from the header alone (a PNG's ``eXIf`` after its pixels is not read)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with image.open(io.BytesIO(data), formats=PILLOW_FORMATS) as picture:
                if picture.format == "PNG" and "exif" not in picture.info:
                    return 1  # Pillow would decode the whole picture to look further
                value = picture.getexif().get(ORIENTATION, 1)
    except Exception:  # any failure to read a header: no orientation to apply
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def oriented(pixels: Pixels, orientation: int) -> Pixels:
    """``pixels`` turned as EXIF ``orientation`` (1 to 8) says, to stand upright."""
    image = pillow()
    if orientation == 1 or image is None:
        return pixels
    turn = _turns(image)[orientation]
    picture = image.frombytes("RGB", (pixels.nx, pixels.ny), pixels.rgb).transpose(turn)
    return Pixels(picture.width, picture.height, picture.tobytes())


def _turns(image: types.ModuleType) -> dict[int, object]:
    """EXIF's orientations as Pillow's transpositions (as ``ImageOps.exif_transpose``)."""
    t = image.Transpose
    return {
        2: t.FLIP_LEFT_RIGHT,
        3: t.ROTATE_180,
        4: t.FLIP_TOP_BOTTOM,
        5: t.TRANSPOSE,
        6: t.ROTATE_270,
        7: t.TRANSVERSE,
        8: t.ROTATE_90,
    }


def _pillow_pixels(image: types.ModuleType, data: bytes, name: str, param: str) -> Pixels:
    """``data``'s first frame read by Pillow, as RGB (alpha dropped, as stb_image drops it),
    upright."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", image.DecompressionBombWarning)
            with image.open(io.BytesIO(data), formats=PILLOW_FORMATS) as picture:
                if picture.width * picture.height > MAX_PIXELS:
                    raise ImageError(
                        f"{name} is {picture.width}x{picture.height} pixels, over the "
                        f"{MAX_PIXELS >> 20} Mpx read",
                        param,
                    )
                picture.seek(0)
                rgb = picture.convert("RGB")
                turn = picture.getexif().get(ORIENTATION, 1)
    except ImageError:
        raise
    except Exception:  # a decoder may fail any way on a broken picture: it is refused
        raise ImageError(
            f"{name} is not a picture the vision encoder can read (PNG, JPEG, GIF, WebP, BMP, ...)", param
        ) from None
    pixels = Pixels(rgb.width, rgb.height, rgb.tobytes())
    return oriented(pixels, turn if isinstance(turn, int) and 1 <= turn <= 8 else 1)
