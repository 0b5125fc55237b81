"""Host headers, pure: ``DISPATCHER_ALLOWED_HOSTS`` and whether a request's Host is one of them.

A DNS-rebinding page reaches the node under the attacker's name: refusing names the node does not
serve shuts that door. ``name`` allows any port, ``name:port`` only that port."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Allowed:
    name: str  # lower case; IPv6 without brackets
    port: int | None  # None: any port


def split(host: str) -> tuple[str, int | None]:
    """``"Example.org:8080"`` -> ("example.org", 8080); ``"[::1]"`` -> ("::1", None).

    ValueError for a port that is not a number."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"{host!r} is not host[:port]")
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
    else:
        name, port = host, ""  # a bare IPv6 address has several colons and no port
    if port and not port.isdigit():
        raise ValueError(f"{host!r}: the port must be a number")
    return name.rstrip("."), int(port) if port else None


def parse_allowed(text: str) -> list[Allowed]:
    """The comma list of ``DISPATCHER_ALLOWED_HOSTS``; empty means any host."""
    allowed = []
    for entry in text.split(","):
        if entry.strip():
            name, port = split(entry)
            if not name:
                raise ValueError(f"{entry.strip()!r} names no host")
            allowed.append(Allowed(name, port))
    return allowed


# What an open node (no key) answers to when DISPATCHER_ALLOWED_HOSTS names nothing: its own
# machine's names. A DNS-rebinding page reaches it under the attacker's name, never these.
LOOPBACK: tuple[Allowed, ...] = (
    Allowed("localhost", None),
    Allowed("127.0.0.1", None),
    Allowed("::1", None),
)


def is_allowed(host: str, allowed: list[Allowed] | tuple[Allowed, ...]) -> bool:
    """Whether a Host header value is listed (always, when the list is empty)."""
    if not allowed:
        return True
    try:
        name, port = split(host)
    except ValueError:
        return False
    return any(item.name == name and item.port in (None, port) for item in allowed)
