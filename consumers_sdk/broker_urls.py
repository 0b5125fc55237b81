"""Several broker URLs, one for each node of a RabbitMQ cluster: their syntax and its checks; pure.

The dispatcher's ``DISPATCHER_AMQP_URL`` and the SDK's ``Consumer(amqp_url=...)`` take one URL or
several, separated by commas (a list or tuple of URLs works too in Python)::

    amqp://user:pw@rabbit-1:5672/jobs,amqp://user:pw@rabbit-2:5672/jobs,amqp://user:pw@rabbit-3:5672/jobs

Each item is a whole URL, so each node may have its own port and TLS options; a comma inside a
password is written ``%2C``. Every item names the same virtual host: the nodes of a cluster serve
the same vhosts, and a list that disagrees is a mistake caught at startup, not a surprise after a
failover. Errors name the item by position, never by value (URLs carry passwords).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

SCHEMES = ("amqp", "amqps")


class BrokerUrlError(ValueError):
    """The broker URLs are not a comma-separated list of amqp:// or amqps:// URLs."""


def parse(value: str | Sequence[str]) -> tuple[str, ...]:
    """The URLs of VALUE (a comma-separated string, or a sequence of URLs), checked."""
    items = value.split(",") if isinstance(value, str) else list(value)
    urls = tuple(item.strip() for item in items)
    if not urls:
        raise BrokerUrlError("no broker URL given")
    vhosts = set()
    for position, url in enumerate(urls, start=1):
        where = f"broker URL {position} of {len(urls)}"
        if not url:
            raise BrokerUrlError(f"{where} is empty (a stray comma?)")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise BrokerUrlError(f"{where} is not a URL ({exc.__class__.__name__})") from None
        if parts.scheme not in SCHEMES:
            raise BrokerUrlError(f"{where}: the scheme must be amqp or amqps")
        if not parts.hostname:
            raise BrokerUrlError(f"{where} names no host")
        vhosts.add(_vhost_of(url))
    if len(vhosts) > 1:
        raise BrokerUrlError("the broker URLs name different virtual hosts; a cluster serves one")
    return urls


def with_default(value: str | Sequence[str], name: str, default: str) -> tuple[str, ...]:
    """The URLs of VALUE (``parse``), each with the query parameter NAME set to DEFAULT where
    it does not set NAME itself (a URL's own setting wins)."""
    urls = []
    for url in parse(value):
        parts = urlsplit(url)
        if name in parse_qs(parts.query):
            urls.append(url)
            continue
        query = f"{parts.query}&" if parts.query else ""
        urls.append(urlunsplit(parts._replace(query=f"{query}{name}={default}")))
    return tuple(urls)


def vhost(value: str | Sequence[str]) -> str:
    """The virtual host the broker URLs name (``parse`` checks that they name one)."""
    first = value.split(",", 1)[0] if isinstance(value, str) else value[0]
    return _vhost_of(first.strip())


def _vhost_of(url: str) -> str:
    return unquote(urlsplit(url).path.removeprefix("/")) or "/"


def login_user(url: str) -> str | None:
    """The user a connection to URL logs in as, as RabbitMQ checks a message's ``user_id``: the
    URL's user (aiormq logs in as ``guest`` without one); None under ``?auth=external``, where the
    broker takes the name from the client's certificate."""
    parts = urlsplit(url)
    mechanism = parse_qs(parts.query).get("auth", ["plain"])[0]
    if mechanism.lower() != "plain":
        return None
    return unquote(parts.username) if parts.username else "guest"
