"""RabbitMQ's management API, as the broker tools use it: which vhost an AMQP URL names, a client
for the API's URL (credentials taken from it), and requests whose failures are BrokerToolError."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx

from consumers_sdk import broker_urls
from consumers_sdk.errors import BrokerToolError

TIMEOUT_S = 10.0


def vhost(amqp_url: str) -> str:
    """The vhost of AMQP_URL (one URL, or a cluster's comma-separated URLs)."""
    return broker_urls.vhost(amqp_url)


def vhost_path(amqp_url: str) -> str:
    """The vhost as one path segment of the management API (``/`` is ``%2F``)."""
    return quote(vhost(amqp_url), safe="")


def connect(management_url: str) -> httpx.AsyncClient:
    parts = urlsplit(management_url)
    auth = (unquote(parts.username or "guest"), unquote(parts.password or "guest"))
    base = f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}{parts.path.rstrip('/')}"
    return httpx.AsyncClient(base_url=base, auth=auth, timeout=TIMEOUT_S)


async def request(http: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    try:
        response = await http.request(method, path, **kwargs)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise BrokerToolError(
            f"RabbitMQ management API at {http.base_url}: {method} {path} answered "
            f"{exc.response.status_code}: {exc.response.text[:300]}"
        ) from exc
    except httpx.HTTPError as exc:
        raise BrokerToolError(f"RabbitMQ management API at {http.base_url}: {exc!r}") from exc
    return response
