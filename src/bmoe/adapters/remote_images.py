"""A remote image fetched (``--allow-remote-media``) without letting a client reach into the
server's own network.

Each hop's host is resolved once; unless the policy allows private addresses, every address
it resolves to must be a public one (``bmoe.domain.media.addresses``: not loopback,
private, link-local such as the cloud metadata service at 169.254.169.254, multicast,
reserved or unspecified, IPv4 carried in IPv6 included), and the address checked is the one
connected to: no second lookup that a name's owner could answer otherwise. The request
names the host (``Host`` header, TLS's SNI and certificate check), as a fetch by name does.
Redirects are followed here, at most ``MAX_REDIRECTS``, each to ``http(s)://`` and each
hop's address checked as the first one's. Environment proxies are not used (a proxy would
resolve the name itself).

The whole fetch is bounded in time (``policy.timeout_s``) and size (``policy.max_bytes``);
every refusal is a ``RequestError`` naming the request's field.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

import attrs

from bmoe.domain.media.addresses import IPAddress, refusal
from bmoe.domain.media.references import PRIVATE_OFF, MediaPolicy
from bmoe.errors import RequestError

CHUNK = 1 << 16
USER_AGENT = "bmoe (image fetch)"
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})

Resolver = Callable[[str, int], list[str]]
"""A host and port to the addresses it resolves to (text, in the order to try)."""


def system_resolver(host: str, port: int) -> list[str]:
    """The system's resolver (``getaddrinfo``): an address literal resolves to itself."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@attrs.frozen
class _Target:
    """One hop: what to connect to and what to ask for."""

    https: bool
    host: str
    port: int
    path: str

    @classmethod
    def of(cls, url: str, where: str) -> _Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise RequestError(f"{where}: the image URL was redirected off http(s) (to {scheme}:)", where)
        try:
            port = parts.port
        except ValueError:
            raise RequestError(f"{where}: the image URL's port is not a number", where) from None
        if not parts.hostname:
            raise RequestError(f"{where}: the image URL names no host", where)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(scheme == "https", parts.hostname, port or (443 if scheme == "https" else 80), path)


def fetch(url: str, where: str, policy: MediaPolicy, resolve: Resolver = system_resolver) -> bytes:
    """``url``'s body, at most ``policy.max_bytes``, within ``policy.timeout_s`` in all,
    fetched from checked addresses only (see the module's docstring)."""
    deadline = time.monotonic() + policy.timeout_s
    try:
        for hop in range(MAX_REDIRECTS + 1):
            target = _Target.of(url, where)
            addresses = _addresses(target, where, policy, resolve, redirected=hop > 0)
            conn, response = _get(target, addresses, deadline)
            try:
                if response.status in REDIRECTS:
                    location = response.getheader("Location")
                    if not location:
                        raise RequestError(f"{where}: the image URL redirects nowhere (no Location)", where)
                    url = urljoin(url, location.strip())
                    continue
                if not 200 <= response.status < 300:
                    raise RequestError(
                        f"{where}: fetching the image was answered {response.status} {response.reason}", where
                    )
                return _body(response, where, policy, deadline)
            finally:
                conn.close()
    except RequestError:
        raise
    except TimeoutError:
        raise RequestError(f"{where}: fetching the image took over {policy.timeout_s:g} s", where) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise RequestError(f"{where}: the image could not be fetched: {reason}", where) from None
    raise RequestError(f"{where}: the image URL redirects more than {MAX_REDIRECTS} times", where)


def _addresses(
    target: _Target, where: str, policy: MediaPolicy, resolve: Resolver, *, redirected: bool
) -> list[IPAddress]:
    """The addresses ``target``'s host resolves to, each checked (``RequestError`` naming
    the first that is not public, unless the policy allows private addresses)."""
    try:
        found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolve(target.host, target.port)]
    except (OSError, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise RequestError(
            f"{where}: the image's host {target.host} could not be resolved: {why}", where
        ) from None
    if not found:
        raise RequestError(f"{where}: the image's host {target.host} resolves to no address", where)
    if policy.allow_private:
        return found
    for address in found:
        why = refusal(address)
        if why is not None:
            via = "the image URL redirects to" if redirected else "the image URL's host is"
            named = target.host if _literal(target.host) == address else f"{target.host} ({address})"
            raise RequestError(f"{where}: {via} {named}, {why}: refused ({PRIVATE_OFF})", where)
    return found


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _get(
    target: _Target, addresses: list[IPAddress], deadline: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """``GET target.path`` from the first of ``addresses`` that answers."""
    failure: OSError = OSError("no address answered")
    for address in addresses:
        conn = _connection(target, address, _left(deadline))
        try:
            conn.request("GET", target.path, headers={"User-Agent": USER_AGENT, "Accept": "image/*"})
            return conn, conn.getresponse()
        except TimeoutError:
            conn.close()
            raise
        except OSError as exc:
            conn.close()
            failure = exc
    raise failure


def _connection(target: _Target, address: IPAddress, timeout: float) -> http.client.HTTPConnection:
    """A connection to ``target.host`` that connects to ``address`` (checked) alone."""
    conn: http.client.HTTPConnection
    if target.https:
        conn = http.client.HTTPSConnection(
            target.host, target.port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)

    def connect(_: object, timeout: float | None, source: object = None) -> socket.socket:
        return socket.create_connection((str(address), target.port), timeout)

    conn._create_connection = connect  # type: ignore[attr-defined]  # http.client's own seam
    return conn


def _body(response: http.client.HTTPResponse, where: str, policy: MediaPolicy, deadline: float) -> bytes:
    length = response.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > policy.max_bytes:
        raise _too_large(where, policy)
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(CHUNK):  # one receive at a time: the deadline holds
        size += len(chunk)
        if size > policy.max_bytes:
            raise _too_large(where, policy)
        _left(deadline)
        chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        raise RequestError(f"{where}: the fetched image is empty", where)
    return data


def _left(deadline: float) -> float:
    """The time left before ``deadline`` (``TimeoutError`` when none is)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _too_large(where: str, policy: MediaPolicy) -> RequestError:
    return RequestError(f"{where}: the image is over the {policy.max_bytes} bytes allowed", where)
