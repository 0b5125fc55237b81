"""Keyring: resolves a bearer token to the Principal it grants, from the static keys of the
settings and the keys stored in PostgreSQL.

Auth is on when a static key is configured, when ``api_auth_required`` is set, or once a key was
ever created in the database. Database answers (a token's key, whether any key exists) are cached
for ``cache_s`` so the submit path does not pay a query per request: a revoked key stops working
within that time on every node. While PostgreSQL is unreachable the last answers are kept, so
/readyz and /metrics still answer a key seen before (the jobs endpoints answer 503 anyway).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Sequence

from dispatcher import errors, keys
from dispatcher.store.keys import KeyStore

# Unknown tokens are cached too (a client retrying a bad key costs no query); past this many
# entries the unknown ones are dropped, so random tokens cannot grow it without bound (the known
# ones stay: a flood of bad tokens must not make valid keys pay a query each).
CACHE_ENTRIES = 10_000


class TokenBucket:
    """``rate`` takes per second with a burst of one second's worth; pure, the clock injected."""

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._clock = clock
        self._tokens = rate
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class Keyring:
    def __init__(
        self,
        *,
        static: Sequence[keys.StaticKey],
        store: KeyStore,
        cache_s: float,
        required: bool = False,
        lookup_rate: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._static = tuple(static)
        self._store = store
        self._cache_s = cache_s
        self._required = required or bool(self._static)
        self._clock = clock
        self._stored_keys_exist: tuple[bool, float] | None = None
        self._found: dict[bytes, tuple[keys.Principal | None, float]] = {}
        # Only tokens without a valid cached answer pay for a query and are rate limited.
        self._lookups = TokenBucket(lookup_rate, clock)

    async def enabled(self) -> bool:
        if self._required:
            return True
        now = self._clock()
        if self._stored_keys_exist is not None and self._stored_keys_exist[1] > now:
            return self._stored_keys_exist[0]
        try:
            exist = await self._store.any()
        except errors.StoreUnavailable:
            if self._stored_keys_exist is None:
                raise  # never known: neither open the API nor refuse a valid key; 503
            return self._stored_keys_exist[0]
        self._stored_keys_exist = (exist, now + self._cache_s)
        return exist

    async def authenticate(self, token: str | None) -> keys.Principal:
        """The caller's Principal; Unauthenticated for a missing or unknown key (auth on),
        TooManyLookups when unknown tokens come faster than ``lookup_rate``."""
        if not await self.enabled():
            return keys.OPEN_ACCESS
        if not token:
            raise errors.Unauthenticated()
        token_digest = keys.digest(token)
        principal = None
        # Every static key is compared, in constant time, whichever matches.
        for static in self._static:
            if hmac.compare_digest(static.digest, token_digest):
                principal = static.principal
        if principal is None:
            principal = await self._stored(token_digest)
        if principal is None:
            raise errors.Unauthenticated("the API key is not valid (unknown or revoked)")
        return principal

    async def _stored(self, token_digest: bytes) -> keys.Principal | None:
        now = self._clock()
        cached = self._found.get(token_digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        # A key known valid is refreshed whatever the rate: only strangers wait.
        if (cached is None or cached[0] is None) and not self._lookups.take():
            raise errors.TooManyLookups()
        try:
            key = await self._store.find(token_digest)
        except errors.StoreUnavailable:
            if cached is None:
                raise
            return cached[0]
        principal = None if key is None else key.principal()
        if len(self._found) >= CACHE_ENTRIES:
            self._found = {digest: found for digest, found in self._found.items() if found[0]}
        self._found[token_digest] = (principal, now + self._cache_s)
        return principal
