"""A request's image references followed to their bytes: a remote one fetched, a local one
read from the media folder (what may be followed is ``bmoe.domain.media.references``).

``load_image`` is what the request core calls: it blocks while it fetches (at most the
policy's ``timeout_s``) or reads, so the server calls it off its event loop when the policy
reaches out (``MediaPolicy.reaches_out``). Every refusal is a ``RequestError`` naming the
request's field; whether the bytes are a picture is mtmd's to say, later.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from http.client import HTTPMessage
from pathlib import Path
from typing import IO

from bmoe.domain.media.images import Image
from bmoe.domain.media.references import (
    InlineImage,
    LocalImage,
    MediaPolicy,
    RemoteImage,
    read_reference,
)
from bmoe.errors import RequestError

CHUNK = 1 << 16
USER_AGENT = "bmoe (image fetch)"


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


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed to ``http(s)://`` only (urllib's would go to ``ftp://`` too)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if not newurl.lower().startswith(("http://", "https://")):
            raise urllib.error.HTTPError(newurl, code, "redirected off http(s)", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch(url: str, where: str, policy: MediaPolicy) -> bytes:
    """``url``'s body, at most ``policy.max_bytes``, within ``policy.timeout_s`` in all."""
    deadline = time.monotonic() + policy.timeout_s
    opener = urllib.request.build_opener(_HttpRedirects())
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Accept": "image/*"})
    try:
        with opener.open(request, timeout=policy.timeout_s) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > policy.max_bytes:
                raise _too_large(where, policy)
            chunks: list[bytes] = []
            size = 0
            while chunk := response.read1(CHUNK):  # one receive at a time: the deadline holds
                size += len(chunk)
                if size > policy.max_bytes:
                    raise _too_large(where, policy)
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        raise RequestError(
            f"{where}: fetching the image was answered {exc.code} {exc.reason}", where
        ) from None
    except TimeoutError:
        raise RequestError(f"{where}: fetching the image took over {policy.timeout_s:g} s", where) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise RequestError(f"{where}: the image could not be fetched: {reason}", where) from None
    data = b"".join(chunks)
    if not data:
        raise RequestError(f"{where}: the fetched image is empty", where)
    return data


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
