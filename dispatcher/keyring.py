"""Keyring: resolves a bearer token to the Principal it grants, from the static keys of the
settings and the keys stored in PostgreSQL.

Auth is on when a static key is configured, when ``api_auth_required`` is set, or once a key was
ever created in the database (a fact that never becomes false: keys are revoked, not deleted).
Database answers (a token's key, that no key exists yet) are cached for ``cache_s`` so the submit
path does not pay a query per request. Creating or revoking a key sends a key notice
(``KEYS_CHANNEL``, in the same statement) and every node drops its caches when it arrives, and
again whenever its listener reconnects (notices sent meanwhile are lost): a new or revoked key
counts at once on every node, ``cache_s`` only bounds a cache the notices somehow missed.

An answer past its cache time is never used: while PostgreSQL is unreachable a stored key, and
any request while no key was known to exist, gets 503. Static keys keep working.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Sequence
from typing import Final

from dispatcher import api_keys, errors
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.listen import ChannelListener

# Unknown tokens are cached too (a client retrying a bad key costs no query); past this many
# entries the unknown ones are dropped, so random tokens cannot grow it without bound (the known
# ones stay: a flood of bad tokens must not make valid keys pay a query each).
CACHE_ENTRIES = 10_000
# Notified by queries.INSERT_API_KEY and queries.REVOKE_API_KEY.
KEYS_CHANNEL: Final = "dispatcher_keys"


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
        static: Sequence[api_keys.StaticKey],
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
        self._keys_exist = False  # once seen true, true for good
        self._none_until: float | None = None  # no stored key, as of a query valid until then
        self._found: dict[bytes, tuple[api_keys.Principal | None, float]] = {}
        # Only tokens without a valid cached answer pay for a query and are rate limited.
        self._lookups = TokenBucket(lookup_rate, clock)
        # Bumped by ``forget``: an answer whose query started before is not cached.
        self._generation = 0

    def listen(self, listener: ChannelListener) -> None:
        """Forget every cached answer on each key notice and each reconnect of ``listener``."""
        listener.subscribe(
            KEYS_CHANNEL, on_notice=lambda _payload: self.forget(), on_connect=self.forget
        )

    def forget(self) -> None:
        """Every cached answer is stale from now on. The keys known valid stay known as such
        (expired): their next lookup is not held back by the rate of unknown tokens."""
        self._generation += 1
        self._none_until = None
        self._found = {
            digest: (principal, 0.0)
            for digest, (principal, _) in self._found.items()
            if principal is not None
        }

    async def enabled(self) -> bool:
        if self._required or self._keys_exist:
            return True
        if self._none_until is not None and self._none_until > self._clock():
            return False
        generation, until = self._generation, self._clock() + self._cache_s
        try:
            exist = await self._store.any()
        except errors.StoreUnavailable:
            # No key can be created while PostgreSQL is away: the last "none", unless a notice
            # or a reconnect since says otherwise, keeps an open node open (its /metrics and
            # /readyz answer through the outage). Never known: 503, neither open nor refused.
            if self._none_until is not None:
                return False
            raise
        if exist:
            self._keys_exist = True
        elif generation == self._generation:
            self._none_until = until
        return exist

    async def authenticate(self, token: str | None) -> api_keys.Principal:
        """The caller's Principal; Unauthenticated for a missing or unknown key (auth on),
        TooManyLookups when unknown tokens come faster than ``lookup_rate``."""
        if not await self.enabled():
            return api_keys.OPEN_ACCESS
        if not token:
            raise errors.Unauthenticated()
        token_digest = api_keys.digest(token)
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

    async def _stored(self, token_digest: bytes) -> api_keys.Principal | None:
        cached = self._found.get(token_digest)
        if cached is not None and cached[1] > self._clock():
            return cached[0]
        # A key known valid is refreshed whatever the rate: only strangers wait.
        if (cached is None or cached[0] is None) and not self._lookups.take():
            raise errors.TooManyLookups()
        generation, until = self._generation, self._clock() + self._cache_s
        key = await self._store.find(token_digest)  # StoreUnavailable: 503, never a stale answer
        principal = None if key is None else key.principal()
        if generation != self._generation:
            # Forgotten while asked: the answer is not kept, but a key found valid stays known
            # (expired), so its next lookup is not held back with the unknown tokens'.
            until = 0.0
            if principal is None:
                return principal
        if len(self._found) >= CACHE_ENTRIES:
            self._found = {digest: found for digest, found in self._found.items() if found[0]}
        self._found[token_digest] = (principal, until)
        return principal
