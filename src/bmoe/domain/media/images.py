"""An image a request carries: its file's bytes (PNG, JPEG, ... as sent), placed in the
prompt's text by a marker."""

from __future__ import annotations

import hashlib

import attrs

from bmoe.errors import ConfigError

# where an image goes in a prompt's text: mtmd's default marker (``mtmd_default_marker()``,
# checked against the library when a vision encoder loads)
MEDIA_MARKER = "<__media__>"


@attrs.frozen
class Image:
    """One picture, as its encoded file (PNG, JPEG, BMP, GIF...: what stb_image decodes).

    ``name`` says where it came from in a request (``messages[0].content[1]``), for errors.
    Two images are the same when their bytes are; the session keys an image's rows by its
    decoded pixels, so the same picture sent as PNG or JPEG of other bytes is two images.
    """

    data: bytes = attrs.field(repr=lambda d: f"<{len(d)} bytes>")
    name: str = attrs.field(default="", eq=False)

    def __attrs_post_init__(self) -> None:
        if not self.data:
            raise ConfigError(f"{self.name or 'an image'} is empty", self.name or None)

    @property
    def digest(self) -> str:
        """sha256 of the file's bytes (hex)."""
        return hashlib.sha256(self.data).hexdigest()


def count_markers(text: str) -> int:
    """How many images ``text`` places."""
    return text.count(MEDIA_MARKER)
