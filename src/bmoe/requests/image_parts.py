"""A message's content read part by part, images among its text: each image becomes a media
marker (``MEDIA_MARKER``) where it stood and an ``Image`` after the ones before it, as
``ChatMessage`` carries them. Every dialect's parser (chat completions, the Responses API,
Anthropic's Messages API) reads its parts into one ``PartsText``; an image reference is
followed by ``bmoe.adapters.image_sources`` under the request's ``MediaPolicy``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from bmoe.adapters.image_sources import load_image
from bmoe.domain.media.images import MEDIA_MARKER, Image
from bmoe.domain.media.references import MediaPolicy, decode_base64
from bmoe.errors import RequestError


def image_list(references: Sequence[object], media: MediaPolicy, field: str = "images") -> tuple[Image, ...]:
    """A request's list of image references (data: URIs, base64, or URLs ``media`` allows),
    each named by its place (``images[0]``); ``RequestError`` naming one that cannot be read."""
    return tuple(load_image(ref, f"{field}[{i}]", f"{field}[{i}]", media) for i, ref in enumerate(references))


@attrs.define
class PartsText:
    """One message's content as its parts are read: text parts and images' markers, in
    order, joined by ``sep`` (a line break, as text parts have always been joined)."""

    media: MediaPolicy
    sep: str = "\n"
    parts: list[str] = attrs.field(factory=list)
    images: list[Image] = attrs.field(factory=list)
    _marked_text: str | None = None  # where a text part holds the marker itself

    def text(self, text: str, where: str) -> None:
        """A text part."""
        if MEDIA_MARKER in text and self._marked_text is None:
            self._marked_text = where
        self.parts.append(text)

    def image(self, reference: object, where: str, name: str) -> None:
        """An image part: ``reference`` (a data: URI, base64 or a URL, at ``where``), the
        part itself at ``name``."""
        self.add(load_image(reference, where, name, self.media))

    def base64_image(self, data: object, where: str, name: str) -> None:
        """An image part given as bare base64 (Anthropic's ``source.data``)."""
        if not isinstance(data, str):
            raise RequestError(f"{where} must be a base64 string", where)
        self.add(Image(decode_base64(data, where), name))

    def add(self, image: Image) -> None:
        self.parts.append(MEDIA_MARKER)
        self.images.append(image)

    def joined(self) -> str:
        """The content's text (``RequestError`` where a text part holds the media marker in
        content that has images: it would take the place of one)."""
        if self.images and self._marked_text is not None:
            raise RequestError(
                f"{self._marked_text}: text must not hold {MEDIA_MARKER} in content with images",
                self._marked_text,
            )
        return self.sep.join(self.parts)

    def read(self) -> tuple[str, tuple[Image, ...]]:
        """The content's text and its images."""
        return self.joined(), tuple(self.images)
