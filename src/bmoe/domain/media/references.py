"""Where a request's image comes from: its reference read, and the policy that says which
references may be followed (pure: the fetching and reading are ``bmoe.adapters.image_sources``).

A reference is what a client puts where an image goes (chat completions' ``image_url.url``,
the Responses API's ``image_url``, Anthropic's ``source``):

- a ``data:`` URI (``data:image/png;base64,...``) or bare base64 (as llama.cpp's server
  takes it): the image's bytes, here;
- an ``http(s)://`` URL: fetched, when the policy allows remote media;
- a ``file://`` URL: read, when the policy names a media folder and the file is in it.

Each refusal is a ``RequestError`` naming the request's field (``where``).
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import attrs

from bmoe.errors import RequestError

MIB = 1 << 20
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")  # base64 holds no ':', so a match is a URL
BLANKS = re.compile(r"\s+")
REMOTE_OFF = "remote image URLs are off (start the server with --allow-remote-media to fetch them)"
PRIVATE_OFF = "start the server with --allow-private-media to fetch from such addresses"
FILES_OFF = "file:// images are off (start the server with --media-path DIR to read them from DIR)"


@attrs.frozen(kw_only=True)
class MediaPolicy:
    """Which image references a request may use, and the bounds on following them.

    - ``allow_remote``: fetch ``http(s)://`` URLs (off: refused);
    - ``allow_private``: with ``allow_remote``, fetch from loopback, private, link-local...
      addresses too (off: a URL whose host resolves to one, or that redirects to one, is
      refused: ``bmoe.domain.media.addresses``);
    - ``media_path``: the folder ``file://`` URLs may read from (resolved, absolute;
      ``None``: refused);
    - ``max_bytes``: the largest image fetched or read (the server's body limit);
    - ``timeout_s``: the longest a fetch may take, whole.
    """

    allow_remote: bool = False
    allow_private: bool = False
    media_path: Path | None = None
    max_bytes: int = 8 * MIB
    timeout_s: float = 10.0

    def __attrs_post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, not {self.max_bytes}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, not {self.timeout_s}")
        if self.media_path is not None and not self.media_path.is_absolute():
            raise ValueError(f"media_path must be absolute (resolved), not {self.media_path}")

    @property
    def reaches_out(self) -> bool:
        """True when following a reference may fetch or read (so may block a while)."""
        return self.allow_remote or self.media_path is not None


INLINE_MEDIA = MediaPolicy()
"""The default: images sent in the request only (no fetching, no files)."""


@attrs.frozen
class InlineImage:
    """An image sent in the request itself: its bytes."""

    data: bytes = attrs.field(repr=lambda d: f"<{len(d)} bytes>")


@attrs.frozen
class RemoteImage:
    """An ``http(s)://`` URL to fetch."""

    url: str


@attrs.frozen
class LocalImage:
    """A file to read, as the ``file://`` URL named it (absolute, not yet resolved: it must
    resolve into the policy's ``media_path``)."""

    path: Path


ImageReference = InlineImage | RemoteImage | LocalImage


def read_reference(text: object, where: str, policy: MediaPolicy) -> ImageReference:
    """The reference ``text`` (at ``where`` in the request) as ``policy`` allows it
    (``RequestError`` when it is not a reference, or one the policy refuses)."""
    if not isinstance(text, str):
        raise RequestError(f"{where} must be a string (a data: URI, base64 or a URL)", where)
    text = text.strip()
    if not text:
        raise RequestError(f"{where}: the image reference is empty", where)
    scheme = SCHEME.match(text)
    if scheme is None:
        return InlineImage(decode_base64(text, where))
    kind = scheme.group(1).lower()
    if kind == "data":
        return InlineImage(_data_uri(text, where))
    if kind in ("http", "https"):
        if not policy.allow_remote:
            raise RequestError(f"{where}: {REMOTE_OFF}", where, "unsupported_parameter")
        return RemoteImage(text)
    if kind == "file":
        if policy.media_path is None:
            raise RequestError(f"{where}: {FILES_OFF}", where, "unsupported_parameter")
        return LocalImage(_file_path(text, where))
    raise RequestError(
        f"{where}: {kind}: URLs are not supported (a data: URI, base64, http(s):// or file://)",
        where,
        "unsupported_parameter",
    )


def decode_base64(text: str, where: str) -> bytes:
    """Base64 (standard or URL-safe alphabet; line breaks and missing padding allowed) as
    bytes (``RequestError`` when it does not decode, or decodes to nothing)."""
    compact = BLANKS.sub("", text).translate(str.maketrans("-_", "+/"))
    compact += "=" * (-len(compact) % 4)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{where}: the image is not valid base64", where) from None
    if not data:
        raise RequestError(f"{where}: the image is empty", where)
    return data


def _data_uri(text: str, where: str) -> bytes:
    """``data:[<media type>][;base64],<data>``: the bytes it holds."""
    header, comma, payload = text[len("data:") :].partition(",")
    if not comma:
        raise RequestError(f"{where}: a data: URI needs a ',' before its data", where)
    params = [p.strip().lower() for p in header.split(";")]
    media_type = params[0]
    if media_type and not media_type.startswith("image/") and media_type != "application/octet-stream":
        raise RequestError(f"{where}: a data: URI of type {media_type!r} is not an image", where)
    if "base64" in params[1:]:
        return decode_base64(payload, where)
    data = unquote_to_bytes(payload)
    if not data:
        raise RequestError(f"{where}: the image is empty", where)
    return data


def _file_path(text: str, where: str) -> Path:
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise RequestError(f"{where}: a file:// URL names no host (got {parts.netloc!r})", where)
    path = unquote(parts.path)
    if not path.startswith("/") or "\0" in path:
        raise RequestError(f"{where}: a file:// URL needs an absolute path", where)
    return Path(path)
