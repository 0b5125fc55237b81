"""PatientTransport: the API commands send a request the node answered 429 (it stored nothing:
busy with as much of that kind as it takes at once) again after its Retry-After, as the SDK's
clients do (``consumers_sdk.exchange.retry_after_s``), a few times before showing the 429."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from consumers_sdk import exchange

TRIES = 5


class PatientTransport(httpx.BaseTransport):
    def __init__(
        self,
        inner: httpx.BaseTransport | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._inner = inner or httpx.HTTPTransport()
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for _ in range(TRIES - 1):
            response = self._inner.handle_request(request)
            if response.status_code != 429:
                return response
            response.read()
            response.close()
            self._sleep(max(exchange.retry_after_s(response), 0.2))
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()
