"""A picture's bytes to the pixels the vision encoder reads (issue 64), without mtmd: a
scripted reader stands in for stb_image (PNG, JPEG, GIF, BMP, as stored). What it reads is
its pixels, turned upright as EXIF says; what it cannot read (WebP, animated or not) is read
by Pillow, its first frame; without Pillow such a picture is refused naming the extra. The
pixels' digest names the picture: one picture in two lossless formats is one picture."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from bmoe.adapters import picture_pixels
from bmoe.adapters.picture_pixels import Pixels, decode, oriented
from bmoe.errors import ImageError

STB_FORMATS = ("PNG", "JPEG", "GIF", "BMP")


def stb(data: bytes) -> Pixels | None:
    """stb_image as mtmd uses it: the formats it reads, as stored (no EXIF), RGB."""
    try:
        with Image.open(io.BytesIO(data), formats=STB_FORMATS) as picture:
            rgb = picture.convert("RGB")
    except Exception:
        return None
    return Pixels(rgb.width, rgb.height, rgb.tobytes())


def never(_: bytes) -> Pixels | None:
    return None


def drawn(seed: int, size: tuple[int, int] = (12, 7)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def saved(picture: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    picture.save(out, fmt, **options)
    return out.getvalue()


def pixels_of(picture: Image.Image) -> Pixels:
    rgb = picture.convert("RGB")
    return Pixels(rgb.width, rgb.height, rgb.tobytes())


def animated(fmt: str, **options: object) -> tuple[bytes, Image.Image]:
    frames = [drawn(1), drawn(2), drawn(3)]
    data = saved(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0, **options)
    return data, frames[0]


def with_orientation(picture: Image.Image, fmt: str, orientation: int, **options: object) -> bytes:
    exif = Image.Exif()
    exif[picture_pixels.ORIENTATION] = orientation
    return saved(picture, fmt, exif=exif.tobytes(), **options)


def test_what_mtmd_reads_is_its_pixels_named_by_their_digest() -> None:
    png = saved(drawn(1), "PNG")
    got = decode(png, "a picture", "images", stb)
    assert got == stb(png) == pixels_of(drawn(1))
    assert got.digest == hashlib.sha256(b"12x7:" + drawn(1).tobytes()).digest()  # as rows were named


def test_webp_lossless_is_read_by_pillow_as_the_same_picture_as_its_png() -> None:
    png, webp = saved(drawn(1), "PNG"), saved(drawn(1), "WEBP", lossless=True)
    assert stb(webp) is None  # what mtmd cannot read
    assert decode(webp, "a picture", "images", stb) == decode(png, "a picture", "images", stb)
    assert decode(webp, "a", "images", stb).digest == decode(png, "a", "images", stb).digest


def test_webp_lossy_is_read_by_pillow() -> None:
    webp = saved(drawn(4, (40, 30)), "WEBP", quality=80)
    got = decode(webp, "a picture", "images", stb)
    with Image.open(io.BytesIO(webp)) as picture:
        assert got == pixels_of(picture)
    assert (got.nx, got.ny) == (40, 30)


@pytest.mark.parametrize("fmt", ["WEBP", "GIF"])
def test_an_animated_picture_is_its_first_frame(fmt: str) -> None:
    data, first = animated(fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    with Image.open(io.BytesIO(data)) as picture:
        assert getattr(picture, "n_frames", 1) == 3
        expected = pixels_of(picture)  # frame 0, as the format stores it (GIF: paletted)
    got = decode(data, "a picture", "images", never)  # read by Pillow
    assert got == expected
    if fmt == "WEBP":
        assert got == pixels_of(first)  # lossless: the first frame exactly
    if fmt == "GIF":
        assert decode(data, "a picture", "images", stb) == expected  # mtmd's reader: the same frame


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_stands_the_picture_up_as_pillow_does(orientation: int) -> None:
    """For each EXIF orientation, a lossless picture read by mtmd's reader (as stored) and
    one read by Pillow both come out as ``ImageOps.exif_transpose`` turns it."""
    picture = drawn(5, (9, 4))
    png = with_orientation(picture, "PNG", orientation)
    webp = with_orientation(picture, "WEBP", orientation, lossless=True)
    with Image.open(io.BytesIO(png)) as stored:
        upright = pixels_of(ImageOps.exif_transpose(stored))
    assert decode(png, "a", "images", stb) == upright
    assert decode(webp, "a", "images", stb) == upright
    turned = orientation in (5, 6, 7, 8)
    assert (upright.nx, upright.ny) == ((4, 9) if turned else (9, 4))


def test_a_rotated_jpeg_is_turned_upright() -> None:
    jpeg = with_orientation(drawn(6, (16, 8)), "JPEG", 6, quality=95)
    as_stored = stb(jpeg)
    assert as_stored is not None and (as_stored.nx, as_stored.ny) == (16, 8)
    got = decode(jpeg, "a", "images", stb)
    assert (got.nx, got.ny) == (8, 16)
    assert got == oriented(as_stored, 6)
    assert got.digest != as_stored.digest


def test_without_pillow_what_mtmd_reads_is_read_and_the_rest_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(picture_pixels, "pillow", lambda: None)
    png = saved(drawn(1), "PNG")
    assert decode(png, "a", "images", stb) == stb(png)
    jpeg = with_orientation(drawn(6, (16, 8)), "JPEG", 6)
    assert decode(jpeg, "a", "images", stb) == stb(jpeg)  # as stored: no orientation without Pillow
    with pytest.raises(ImageError) as caught:
        decode(saved(drawn(1), "WEBP"), "messages[0].content[0]", "messages[0].content[0]", stb)
    assert "bmoe[vision]" in str(caught.value) and "WebP" in str(caught.value)
    assert caught.value.where == "messages[0].content[0]"


@pytest.mark.parametrize(
    "data",
    [
        b"not a picture",
        saved(drawn(1), "PNG")[:40],  # truncated
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",  # EPS: Pillow runs gs
        b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>',
        b"RIFF\x10\x00\x00\x00WEBPVP8 junk",
    ],
)
def test_what_is_no_picture_is_refused_by_name(data: bytes) -> None:
    with pytest.raises(ImageError) as caught:
        decode(data, "input[0].content[1]", "input[0].content[1]", stb)
    assert "input[0].content[1] is not a picture" in str(caught.value)
    assert caught.value.where == "input[0].content[1]"


def test_a_picture_of_too_many_pixels_is_refused_before_it_is_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(picture_pixels, "MAX_PIXELS", 50)
    with pytest.raises(ImageError, match="12x7 pixels, over"):
        decode(saved(drawn(1), "WEBP"), "a", "images", stb)


def test_pixels_hold_their_size() -> None:
    with pytest.raises(ValueError):
        Pixels(2, 2, b"\0" * 11)
