"""The connection slots each client may hold, pure: a share of the server's
``DISPATCHER_HTTP_MAX_CONNECTIONS``, so that one client that keeps (re)connecting cannot take
every slot and lock the others out.

A client is the address its connection comes from, as the socket reports it (``X-Forwarded-*``
is never read: a client would name itself). An IPv6 client counts by its /64, since one host is
given a /64 and may use any address in it; an IPv4-mapped IPv6 address counts as its IPv4 one.
Loopback is an address like any other. Behind a proxy or load balancer every request comes from
its few addresses: raise the share there, up to the cap (where one address may take every slot).
"""

from __future__ import annotations

import ipaddress

IPV6_PREFIX = 64  # the block one IPv6 host is usually given, counted as one client


def client_of(peer: object) -> str:
    """The client a connection from PEER (``transport.get_extra_info("peername")``: a (host,
    port, ...) tuple for TCP) counts as; connections whose address is unknown share one client."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return "unknown"
    host = peer[0].partition("%")[0]  # an IPv6 scope (fe80::1%eth0) is not part of the address
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_PREFIX), strict=False))
    return str(address)


class ClientSlots:
    """How many connections each client holds, against ``share`` each."""

    def __init__(self, share: int) -> None:
        self.share = share
        self._held: dict[str, int] = {}

    def take(self, client: str) -> bool:
        """Count one more connection for CLIENT; False (nothing counted) past its share."""
        held = self._held.get(client, 0)
        if held >= self.share:
            return False
        self._held[client] = held + 1
        return True

    def give_back(self, client: str) -> None:
        """One connection CLIENT took has ended."""
        held = self._held.get(client, 0) - 1
        if held > 0:
            self._held[client] = held
        else:
            self._held.pop(client, None)

    def held(self, client: str) -> int:
        return self._held.get(client, 0)

    def __len__(self) -> int:
        """The clients holding a slot now (one that gave every slot back is forgotten)."""
        return len(self._held)
