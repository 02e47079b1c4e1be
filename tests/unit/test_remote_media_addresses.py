"""A remote image is fetched from public addresses only (issue 64): a URL whose host is, or
resolves to, a loopback, private, link-local (the cloud metadata service), multicast,
reserved or unspecified address, IPv4 carried in IPv6 included, or that redirects to one, is
refused by name before anything is connected to, unless the policy allows private
addresses; the address checked is the one connected to (one lookup a hop), the host named
in the request. A local HTTP server stands in for the web; an injected resolver for DNS."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from bmoe.adapters import remote_images
from bmoe.adapters.remote_images import MAX_REDIRECTS, fetch
from bmoe.domain.media.addresses import refusal
from bmoe.domain.media.references import MediaPolicy
from bmoe.errors import RequestError

PICTURE = b"\x89PNG not really" * 8
AT = "input[0].content[0].image_url"
REMOTE = MediaPolicy(allow_remote=True, timeout_s=5.0)
PRIVATE_TOO = MediaPolicy(allow_remote=True, allow_private=True, timeout_s=5.0)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("100.64.0.1", "non-public"),  # carrier-grade NAT
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a00:1::1", "private"),  # 6to4 of 10.0.0.1
    ],
)
def test_addresses_that_are_not_public_are_named(address: str, why: str) -> None:
    said = refusal(ipaddress.ip_address(address))
    assert said is not None and why in said


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
)
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


class Pictures(BaseHTTPRequestHandler):
    """``/pic``: the picture (the Host header it was asked with kept); ``/to-local``: a
    redirect to this server by its loopback address; ``/to-name``: a redirect to
    ``inside.test`` (which the tests' resolver places on loopback); ``/loop``: a redirect to
    itself; ``/to-ftp``: a redirect off http."""

    protocol_version = "HTTP/1.0"
    hosts: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        if self.path == "/pic":
            self.hosts.append(self.headers.get("Host", ""))
            self._send(200, PICTURE)
        elif self.path == "/to-local":
            self._redirect(f"http://127.0.0.1:{port}/pic")
        elif self.path == "/to-name":
            self._redirect(f"http://inside.test:{port}/pic")
        elif self.path == "/loop":
            self._redirect("/loop")
        elif self.path == "/to-ftp":
            self._redirect("ftp://example.com/pic")
        else:
            self._send(404, b"no")

    def _redirect(self, where: str) -> None:
        self.send_response(302)
        self.send_header("Location", where)
        self.end_headers()

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Pictures.hosts = []
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def no_connection(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every connection the fetcher tries, none made (a refusal must come before one)."""
    tried: list[tuple[str, int]] = []

    def connect(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        tried.append(address)
        raise AssertionError(f"connected to {address}")

    monkeypatch.setattr(remote_images.socket, "create_connection", connect)
    return tried


def refused(url: str, policy: MediaPolicy = REMOTE, **kw: Any) -> str:
    with pytest.raises(RequestError) as info:
        fetch(url, AT, policy, **kw)
    assert info.value.param == AT
    return str(info.value)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1/cat.png", "127.0.0.1, a loopback address"),
        ("http://10.0.0.1/cat.png", "10.0.0.1, a private address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254, a link-local address"),
        ("http://[::1]:8080/cat.png", "::1, a loopback address"),
        ("https://[::ffff:127.0.0.1]/cat.png", "::ffff:127.0.0.1, a loopback address"),
        ("http://0.0.0.0/cat.png", "an unspecified address"),
        ("http://[fe80::1]/cat.png", "a link-local address"),
    ],
)
def test_an_address_that_is_not_public_is_refused_before_connecting(
    url: str, why: str, no_connection: list[tuple[str, int]]
) -> None:
    said = refused(url)
    assert why in said and "--allow-private-media" in said
    assert no_connection == []


def test_a_name_that_resolves_to_a_private_address_is_refused_by_name(
    no_connection: list[tuple[str, int]],
) -> None:
    said = refused("http://localhost/cat.png")  # the system's resolver: loopback
    assert "the image URL's host is localhost (" in said and "a loopback address" in said
    injected = refused("http://images.example.com/cat.png", resolve=lambda host, port: ["10.1.2.3"])
    assert "images.example.com (10.1.2.3), a private address" in injected
    # one address of several is enough: the one a second lookup might give is not trusted
    mixed = refused("http://images.example.com/cat.png", resolve=lambda host, port: ["8.8.8.8", "127.0.0.1"])
    assert "(127.0.0.1), a loopback address" in mixed
    assert no_connection == []


def test_a_public_looking_url_that_redirects_to_loopback_is_refused(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pics.example.com`` resolves (injected) to a public address; the connection to that
    address reaches the local server, which redirects to loopback, by address or by name."""
    public = "93.184.216.34"
    real = socket.create_connection
    tried: list[tuple[str, int]] = []

    def connect(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        tried.append(address)
        assert address[0] == public, address  # nothing else is connected to
        return real(("127.0.0.1", address[1]), *args, **kwargs)

    monkeypatch.setattr(remote_images.socket, "create_connection", connect)

    def resolve(host: str, _: int) -> list[str]:
        return {"pics.example.com": [public], "inside.test": ["127.0.0.1"]}.get(host) or [host]

    to_local = refused(f"http://pics.example.com:{port}/to-local", resolve=resolve)
    assert "the image URL redirects to 127.0.0.1, a loopback address: refused" in to_local
    to_name = refused(f"http://pics.example.com:{port}/to-name", resolve=resolve)
    assert "redirects to inside.test (127.0.0.1), a loopback address" in to_name
    assert tried == [(public, port), (public, port)]
    assert Pictures.hosts == []  # the picture was never asked for


def test_a_local_server_is_fetched_only_when_private_addresses_are_allowed(port: int) -> None:
    url = f"http://127.0.0.1:{port}/pic"
    assert "a loopback address: refused" in refused(url)
    assert fetch(url, AT, PRIVATE_TOO) == PICTURE
    assert fetch(f"http://127.0.0.1:{port}/to-local", AT, PRIVATE_TOO) == PICTURE  # redirects followed
    assert "redirected off http(s)" in refused(f"http://127.0.0.1:{port}/to-ftp", PRIVATE_TOO)
    assert f"redirects more than {MAX_REDIRECTS} times" in refused(
        f"http://127.0.0.1:{port}/loop", PRIVATE_TOO
    )


def test_the_address_resolved_is_the_one_connected_to_and_the_host_is_named(port: int) -> None:
    """One lookup a hop: the name is asked of the resolver once, its answer connected to,
    and the request names the host (the Host header), as a fetch by name does."""
    asked: list[str] = []

    def resolve(host: str, _: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    assert fetch(f"http://pics.test:{port}/pic", AT, PRIVATE_TOO, resolve=resolve) == PICTURE
    assert asked == ["pics.test"]
    assert Pictures.hosts == [f"pics.test:{port}"]
    asked.clear()
    assert fetch(f"http://pics.test:{port}/to-name", AT, PRIVATE_TOO, resolve=resolve) == PICTURE
    assert asked == ["pics.test", "inside.test"]


def test_a_name_that_does_not_resolve_is_refused_by_name() -> None:
    def resolve(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    said = refused("http://nowhere.invalid/cat.png", resolve=resolve)
    assert "nowhere.invalid could not be resolved: Name or service not known" in said
    assert "resolves to no address" in refused("http://empty.test/a.png", resolve=lambda h, p: [])
