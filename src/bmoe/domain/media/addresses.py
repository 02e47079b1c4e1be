"""Which addresses a remote image may be fetched from (pure: ``ipaddress`` only).

A server that fetches the URLs its clients send must not become their way into its own
network: its loopback, its private ranges, the cloud's metadata service at 169.254.169.254.
``refusal`` names what an address is when it is not a public one; the fetcher
(``bmoe.adapters.image_sources``) refuses such an address, the one it resolved and would
connect to, unless the policy allows private addresses (``--allow-private-media``).

An IPv6 address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, NAT64's
``64:ff9b::/96``, 6to4, Teredo) is judged by the IPv4 address it reaches as well.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def refusal(address: IPAddress) -> str | None:
    """What ``address`` is when it is not a public unicast address (``"a loopback address"``,
    ``"a private address"``...), None for a public one."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in NAT64_LOCAL:
            return "a private address"
        if (translated := _translated(address)) is not None:
            return refusal(translated)  # connecting to it is connecting to the IPv4 address
        for inner in _tunnelled(address):
            if (why := refusal(inner)) is not None:
                return why
    checks = (
        (address.is_unspecified, "an unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_reserved, "a reserved address"),
        (address.is_private, "a private address"),
        (not address.is_global, "a non-public address"),
    )
    return next((why for hit, why in checks if hit), None)


def _translated(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped or NAT64 address stands for."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _tunnelled(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a 6to4 or Teredo address reaches."""
    inner = [address.sixtofour] if address.sixtofour is not None else []
    return inner + list(address.teredo or ())
