"""A request's image references followed to their bytes: a remote one fetched, a local one
read from the media folder (what may be followed is ``bmoe.domain.media.references``).

``load_image`` is what the request core calls: it blocks while it fetches (at most the
policy's ``timeout_s``) or reads, so the server calls it off its event loop when the policy
reaches out (``MediaPolicy.reaches_out``). A remote image is fetched by
``bmoe.adapters.remote_images`` (from public addresses only, unless the policy allows
private ones). Every refusal is a ``RequestError`` naming the request's field; whether the
bytes are a picture is the vision encoder's to say, later.
"""

from __future__ import annotations

from pathlib import Path

from bmoe.adapters.remote_images import fetch
from bmoe.domain.media.images import Image
from bmoe.domain.media.references import (
    InlineImage,
    LocalImage,
    MediaPolicy,
    RemoteImage,
    read_reference,
)
from bmoe.errors import RequestError


def load_image(reference: object, where: str, name: str, policy: MediaPolicy) -> Image:
    """The image ``reference`` (at ``where`` in the request) names, as ``Image(name=name)``
    (``RequestError`` when the policy refuses it, or it cannot be fetched or read)."""
    ref = read_reference(reference, where, policy)
    if isinstance(ref, InlineImage):
        data = ref.data
    elif isinstance(ref, RemoteImage):
        data = fetch(ref.url, where, policy)
    else:
        data = read_local(ref, where, policy)
    return Image(data, name)


def read_local(ref: LocalImage, where: str, policy: MediaPolicy) -> bytes:
    """The file ``ref`` names, once resolved (links followed) inside ``policy.media_path``."""
    root = policy.media_path
    if root is None:  # read_reference refuses a file:// URL without a media folder
        raise RequestError(f"{where}: file:// images are off", where)
    # one answer for missing, outside and not a file: a client cannot probe the disk
    refused = RequestError(f"{where}: no such file in the media folder (--media-path)", where)
    try:
        path = ref.path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise refused from None
    if not path.is_relative_to(root) or not path.is_file():
        raise refused
    return _read_bounded(path, where, policy)


def _read_bounded(path: Path, where: str, policy: MediaPolicy) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(policy.max_bytes + 1)
    except OSError as exc:
        raise RequestError(f"{where}: the file could not be read: {exc.strerror or exc}", where) from None
    if len(data) > policy.max_bytes:
        raise _too_large(where, policy)
    if not data:
        raise RequestError(f"{where}: the file is empty", where)
    return data


def _too_large(where: str, policy: MediaPolicy) -> RequestError:
    return RequestError(f"{where}: the image is over the {policy.max_bytes} bytes allowed", where)
